"""The CUDA path over a ragged (adakv) cache: flash-attn's varlen kernel, tested on CPU with a stand-in.

There is no GPU here, so `flash_attn` is a stand-in module implementing flash_attn_varlen_func's documented
semantics in torch (sequences packed along the first axis and delimited by cu_seqlens, query head j reading
KV head j // (nheads / nheads_k), a causal mask aligned to the bottom right) and recording its inputs, and
the CUDA check is faked. What must hold: the inputs built from the ragged layer are those the kernel
documents (cu_seqlens, max_seqlen, head mapping, causal only for multi-token forwards), the outputs equal
the padded path's, the record names the kernel that ran, and the fallback says why.
"""

import sys
import types

import pytest
import torch

from kvmethods import get_method
from kvmethods.attention import ragged_attention as ragged_attention_module
from kvmethods.runtime.generation import generate, prefill
from kvmethods.storage.ragged import KERNEL as PADDED_KERNEL
from kvmethods.storage.ragged import RaggedLayer, visibility_mask
from kvmethods.attention.ragged_attention import VARLEN_KERNEL, kernel_name, varlen_arguments
from kvmethods.testing import tiny_model
from kvmethods.adapters.transformers_compat import attention_implementation
from model_helpers import FAMILIES, one_thread  # noqa: F401 (one_thread applies here)

PROMPT = torch.randint(3, 256, (64,), generator=torch.Generator().manual_seed(11)).tolist()


def stand_in_flash_attn(calls: list) -> types.ModuleType:
    """A `flash_attn` module whose flash_attn_varlen_func follows flash_attn_interface.py's docstring."""

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                               alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
        calls.append(dict(q_shape=tuple(q.shape), k_shape=tuple(k.shape), cu_seqlens_q=cu_seqlens_q.tolist(),
                          cu_seqlens_k=cu_seqlens_k.tolist(), max_seqlen_q=max_seqlen_q,
                          max_seqlen_k=max_seqlen_k, causal=causal, dtype=cu_seqlens_k.dtype))
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
        per_kv_head = q.shape[1] // k.shape[1]
        out = torch.empty_like(q)
        for b in range(len(cu_seqlens_q) - 1):
            q0, q1, k0, k1 = (int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]), int(cu_seqlens_k[b]),
                              int(cu_seqlens_k[b + 1]))
            rows, cols = q1 - q0, k1 - k0
            hidden = torch.arange(cols) > torch.arange(rows).unsqueeze(-1) + cols - rows  # bottom-right causal
            for head in range(q.shape[1]):
                logits = q[q0:q1, head] @ k[k0:k1, head // per_kv_head].T * scale
                if causal:
                    logits = logits.masked_fill(hidden, float("-inf"))
                out[q0:q1, head] = torch.softmax(logits, dim=-1) @ v[k0:k1, head // per_kv_head]
        return out

    module = types.ModuleType("flash_attn")
    module.flash_attn_varlen_func = flash_attn_varlen_func
    return module


@pytest.fixture
def fake_cuda_flash_attn(monkeypatch):
    """A flash_attn stand-in installed, the model taken for a CUDA one, float32 let through (the real kernel
    takes half precision only; the stand-in computes in any dtype, so outputs compare to 1e-5)."""
    calls = []
    monkeypatch.setitem(sys.modules, "flash_attn", stand_in_flash_attn(calls))
    monkeypatch.setattr(ragged_attention_module, "on_cuda", lambda model: True)
    monkeypatch.setattr(ragged_attention_module, "VARLEN_DTYPES", (torch.float32,))
    return calls


def ragged_layer(kept_counts, tail, dim=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    heads, length = len(kept_counts), 10
    keys = torch.randn(1, heads, length, dim, generator=generator)
    values = torch.randn(1, heads, length, dim, generator=generator)
    kept = torch.zeros(1, heads, length, dtype=torch.bool)
    for head, count in enumerate(kept_counts):
        kept[0, head, torch.randperm(length, generator=generator)[:count]] = True
    layer = RaggedLayer(keys, values, kept)
    new_keys = torch.randn(1, heads, tail, dim, generator=generator)
    new_values = torch.randn(1, heads, tail, dim, generator=generator)
    layer.packed_reads = True
    return layer, layer.update(new_keys, new_values)


def test_varlen_inputs_pack_each_kv_head_as_one_sequence_with_its_query_heads():
    layer, (tail_keys, tail_values) = ragged_layer([5, 3], tail=2)
    assert tail_keys.shape[-2] == 2  # packed reads hand out the tail, no padded view
    query = torch.randn(1, 6, 2, 4)  # 6 query heads over 2 KV heads: heads 0-2 read KV head 0, 3-5 KV head 1
    args = varlen_arguments(query, layer, tail_keys, tail_values, 0.5)
    assert args["cu_seqlens_q"].tolist() == [0, 2, 4] and args["cu_seqlens_q"].dtype == torch.int32
    assert args["cu_seqlens_k"].tolist() == [0, 7, 12] and args["cu_seqlens_k"].dtype == torch.int32
    assert (args["max_seqlen_q"], args["max_seqlen_k"], args["causal"], args["softmax_scale"]) == (2, 7, True, 0.5)
    assert args["q"].shape == (4, 3, 4) and args["k"].shape == args["v"].shape == (12, 1, 4)
    for kv_head in range(2):
        for row in range(2):
            for group in range(3):
                assert torch.equal(args["q"][kv_head * 2 + row, group], query[0, kv_head * 3 + group, row])
    torch.testing.assert_close(args["k"][:5, 0], layer.head_keys[0], rtol=0, atol=0)
    torch.testing.assert_close(args["k"][5:7, 0], tail_keys[0, 0], rtol=0, atol=0)
    torch.testing.assert_close(args["v"][7:10, 0], layer.head_values[1], rtol=0, atol=0)
    torch.testing.assert_close(args["v"][10:, 0], tail_values[0, 1], rtol=0, atol=0)
    decode = varlen_arguments(query[:, :, -1:], layer, tail_keys, tail_values, None)
    assert decode["causal"] is False and decode["cu_seqlens_q"].tolist() == [0, 1, 2]


@pytest.mark.parametrize("family", FAMILIES)
def test_varlen_generation_equals_the_padded_path(family, fake_cuda_flash_attn, monkeypatch):
    model = tiny_model(family, seed=5, qk_scale=4.0, num_attention_heads=8)  # 4 query heads per KV head
    method = get_method("adakv", base="snapkv", window=4)
    varlen = generate(model, method, "12", PROMPT, 48, 4, set(), "query_agnostic", return_logprobs=True)
    assert varlen.ragged_kernel == VARLEN_KERNEL
    assert attention_implementation(model) == "sdpa"  # switched back after each forward
    layers, heads = model.config.num_hidden_layers, model.config.num_key_value_heads
    # the question (16 tokens) in one causal forward, then 3 decoding steps of one query each
    assert len(fake_cuda_flash_attn) == layers * 4
    question, step = fake_cuda_flash_attn[0], fake_cuda_flash_attn[-1]
    assert question["causal"] and question["max_seqlen_q"] == 16 and question["dtype"] == torch.int32
    assert question["cu_seqlens_q"] == list(range(0, 16 * (heads + 1), 16))
    assert not step["causal"] and step["max_seqlen_q"] == 1
    state = prefill(model, method, "12", PROMPT, 48, "query_agnostic")
    last_counts = state.cache.layers[-1].kept_per_head
    assert len(set(last_counts)) > 1, "heads kept equal counts: the test would prove nothing"
    lengths = [n + 16 + 3 for n in last_counts]  # prompt kept, question, the 3 decoded tokens fed back
    assert step["cu_seqlens_k"] == [sum(lengths[:h]) for h in range(heads + 1)]
    assert step["max_seqlen_k"] == max(lengths)

    monkeypatch.setattr(ragged_attention_module, "VARLEN_DTYPES", (torch.float16,))  # the padded path now
    calls = len(fake_cuda_flash_attn)
    padded = generate(model, method, "12", PROMPT, 48, 4, set(), "query_agnostic", return_logprobs=True)
    assert padded.ragged_kernel.startswith(PADDED_KERNEL) and len(fake_cuda_flash_attn) == calls
    assert varlen.tokens == padded.tokens
    torch.testing.assert_close(varlen.logprobs, padded.logprobs, rtol=1e-5, atol=1e-5)


def test_dense_layers_keep_sdpa_while_the_kernel_is_active(fake_cuda_flash_attn):
    model = tiny_model("llama", seed=5, qk_scale=4.0)
    dense = generate(model, get_method("snapkv", window=4), "12", PROMPT, 48, 3, set(), "query_agnostic")
    assert dense.ragged_kernel is None and fake_cuda_flash_attn == []


def test_the_fallback_record_says_why(monkeypatch):
    model = tiny_model("llama", seed=5)
    assert kernel_name(model) == PADDED_KERNEL  # CPU
    monkeypatch.setattr(ragged_attention_module, "on_cuda", lambda model: True)
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # import flash_attn raises ImportError
    assert kernel_name(model) == f"{PADDED_KERNEL} (flash-attn not installed)"
    out = generate(model, get_method("adakv", window=4), "12", PROMPT, 48, 2, set(), "query_agnostic")
    assert out.ragged_kernel == f"{PADDED_KERNEL} (flash-attn not installed)"
    monkeypatch.setitem(sys.modules, "flash_attn", stand_in_flash_attn([]))
    assert kernel_name(model) == f"{PADDED_KERNEL} (flash-attn takes float16/bfloat16)"
    assert kernel_name(tiny_model("llama", seed=5, dtype=torch.bfloat16)) == VARLEN_KERNEL


def test_decoding_reads_one_padded_view_filled_in_place_equal_to_re_padding():
    # heads keep 5 and 2 prompt tokens: the padded view is 5 long, head 1's 3 padded slots hidden by the mask
    generator = torch.Generator().manual_seed(3)
    keys, values = torch.randn(1, 2, 10, 4, generator=generator), torch.randn(1, 2, 10, 4, generator=generator)
    kept = torch.zeros(1, 2, 10, dtype=torch.bool)
    kept[0, 0, :5], kept[0, 1, [2, 7]] = True, True
    layer = RaggedLayer(keys, values, kept)
    question = torch.randn(1, 2, 3, 4, generator=generator), torch.randn(1, 2, 3, 4, generator=generator)
    layer.update(*question)  # a multi-token forward before decoding pads once, keeps no view
    assert layer._view is None
    pointers = set()
    for step in range(150):  # past the first room (5 + 64): the view grows once or twice
        mask = layer.attention_mask(1, 6, torch.float32)
        new = torch.randn(1, 2, 1, 4, generator=generator), torch.randn(1, 2, 1, 4, generator=generator)
        got_keys, got_values = layer.update(*new)
        pointers.add(got_keys.data_ptr())
        expected_keys, expected_values = layer._padded(layer.head_keys, layer.keys), layer._padded(layer.head_values,
                                                                                                  layer.values)
        assert torch.equal(got_keys, expected_keys) and torch.equal(got_values, expected_values)
        tail = layer.keys.shape[-2] - 1
        expected_mask = visibility_mask(torch.tensor([5, 2]), 5, tail, 1, torch.float32).repeat_interleave(3, dim=1)
        assert torch.equal(mask, expected_mask)
    assert 1 < len(pointers) <= 3, "the view was re-made every step (or never grown)"
    row = 4 * 4 * 2  # one token of one head: keys and values of 4 float32
    assert layer.stored_bytes() == row * (5 + 2 + 2 * (3 + 150))  # the storage, not the working view


def test_a_snapshot_restored_under_decoding_reads_the_earlier_view():
    layer, _ = ragged_layer([4, 1], tail=0, seed=2)
    layer.packed_reads = False
    generator = torch.Generator().manual_seed(4)
    for _ in range(3):
        layer.update(torch.randn(1, 2, 1, 4, generator=generator), torch.randn(1, 2, 1, 4, generator=generator))
    layer.keys, layer.values = layer.keys[..., :1, :], layer.values[..., :1, :]  # what CacheSnapshot.restore does
    new = torch.randn(1, 2, 2, 4, generator=generator), torch.randn(1, 2, 2, 4, generator=generator)
    got_keys, got_values = layer.update(*new)
    assert got_keys.shape[-2] == 4 + 3
    assert torch.equal(got_keys, layer._padded(layer.head_keys, layer.keys))
    assert torch.equal(got_values, layer._padded(layer.head_values, layer.values))
