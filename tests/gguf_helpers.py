"""Tiny GGUF files written with the ``gguf`` package's writer: a two-layer Llama that transformers
loads in well under a second, so conversion and its cache are tested without the 98 MB file."""

from pathlib import Path

import numpy as np


def _byte_level_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes: the base vocabulary of a byte-level BPE."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    extra = [b for b in range(256) if b not in printable]
    return [chr(c) for c in printable] + [chr(256 + i) for i in range(len(extra))]


def write_tiny_gguf(path: Path, architecture: str = "llama", context_length: int = 4096, seed: int = 0,
                    heads: int = 4, kv_heads: int = 2) -> Path:
    """A 2-layer Llama (hidden 64, 4 query / 2 KV heads of 16) with Q8_0 weights and a byte-level tokenizer;
    ``heads`` / ``kv_heads`` other than those make headers whose shapes do not divide (heads of 16 all the same)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    tokens = ["<unk>", "<s>", "</s>", *_byte_level_alphabet(), "Ġt", "he"]
    hidden, layers, head_dim, ffn = 64, 2, 16, 96
    writer.add_name("tiny test llama")
    writer.add_context_length(context_length)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    writer.add_token_merges(["Ġ t", "h e"])
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_pad_token_id(2)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    rng = np.random.default_rng(seed)

    def tensor(name: str, shape: tuple[int, ...], quantized: bool = True) -> None:
        values = (rng.standard_normal(shape) * 0.05).astype(np.float32)
        if not quantized or shape[-1] % 32:  # Q8_0 packs rows in blocks of 32
            writer.add_tensor(name, values)
            return
        data = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
        writer.add_tensor(name, data, raw_shape=data.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    tensor("token_embd.weight", (len(tokens), hidden))
    tensor("output_norm.weight", (hidden,), quantized=False)
    for i in range(layers):
        tensor(f"blk.{i}.attn_norm.weight", (hidden,), quantized=False)
        tensor(f"blk.{i}.ffn_norm.weight", (hidden,), quantized=False)
        tensor(f"blk.{i}.attn_q.weight", (heads * head_dim, hidden))
        tensor(f"blk.{i}.attn_k.weight", (kv_heads * head_dim, hidden))
        tensor(f"blk.{i}.attn_v.weight", (kv_heads * head_dim, hidden))
        tensor(f"blk.{i}.attn_output.weight", (hidden, heads * head_dim))
        tensor(f"blk.{i}.ffn_gate.weight", (ffn, hidden))
        tensor(f"blk.{i}.ffn_up.weight", (ffn, hidden))
        tensor(f"blk.{i}.ffn_down.weight", (hidden, ffn))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def truncated_copy(source: Path, target: Path, keep: float = 0.7) -> Path:
    data = source.read_bytes()
    target.write_bytes(data[: int(len(data) * keep)])
    return target


def write_gguf_with_tensor_type(path: Path, type_name: str) -> Path:
    """A whole Llama GGUF header whose one weight is stored as ``type_name`` (zero bytes), besides a float norm."""
    import gguf  # lazy: the [gguf] extra; its tests importorskip it

    qtype = gguf.GGMLQuantizationType[type_name]
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny test llama")
    writer.add_context_length(64)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((2, block_bytes), dtype=np.uint8), raw_shape=(2, block_bytes),
                      raw_dtype=qtype)
    writer.add_tensor("output_norm.weight", np.ones((4,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

