"""A model folder of a published model's shape with random weights, for speed and memory figures on a GPU.

Latency, peak memory and KV bytes depend on the architecture (layers, heads, head size, MLP width), not on
what the weights learned, so a randomly initialised model of Llama-3-8B's shape costs what Llama-3-8B costs
while needing no download. Scores of such a model are meaningless and must never be reported as scores.
The tokenizer is the embedded model's (vocabulary 4,096): the embedding and output layers are sized to it,
so the parameter count is that of the published body with a small vocabulary (say so beside any figure).

    python scripts/measure/random_model.py llama-3-8b /tmp/llama-3-8b-random [--device cuda]
    pytest bench/test_ruler.py --kvbench-model /tmp/llama-3-8b-random ...
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EMBEDDED = ROOT / "pytest_kvbench" / "default_model"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

# Shapes from each model's published config.json (layers, widths, heads, RoPE base, positions).
SHAPES = {
    "llama-3-8b": dict(model_type="llama", num_hidden_layers=32, hidden_size=4096, intermediate_size=14336,
                       num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                       max_position_embeddings=131072),
    "qwen2.5-7b": dict(model_type="qwen2", num_hidden_layers=28, hidden_size=3584, intermediate_size=18944,
                       num_attention_heads=28, num_key_value_heads=4, rope_theta=1000000.0,
                       max_position_embeddings=131072),
    "mistral-7b": dict(model_type="mistral", num_hidden_layers=32, hidden_size=4096, intermediate_size=14336,
                       num_attention_heads=32, num_key_value_heads=8, rope_theta=1000000.0,
                       max_position_embeddings=32768),
    # Qwen2.5-0.5B's body: big enough on a CPU to show a slow decode path (docs/performance.md, issue 36).
    "qwen2.5-0.5b": dict(model_type="qwen2", num_hidden_layers=24, hidden_size=896, intermediate_size=4864,
                         num_attention_heads=14, num_key_value_heads=2, rope_theta=1000000.0,
                         max_position_embeddings=32768),
    # A few layers of Llama-3-8B's width: checks the script end to end on a CPU.
    "llama-3-8b-2layers": dict(model_type="llama", num_hidden_layers=2, hidden_size=4096, intermediate_size=14336,
                               num_attention_heads=32, num_key_value_heads=8, rope_theta=500000.0,
                               max_position_embeddings=131072),
}


def build(shape: str, out: Path, device: str = "cpu", seed: int = 0) -> int:
    """Write the random model to `out`; returns its parameter count."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    settings = dict(SHAPES[shape])
    model_type = settings.pop("model_type")
    tokenizer = AutoTokenizer.from_pretrained(EMBEDDED)
    config = AutoConfig.for_model(model_type, vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                                  tie_word_embeddings=False, **settings)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        shutil.copy(EMBEDDED / name, out / name)
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="cpu", help="where the weights are initialised (cuda is much faster)")
    args = parser.parse_args()
    count = build(args.shape, args.out, args.device)
    print(f"{args.shape}: {count / 1e9:.2f} B parameters (random, bf16) in {args.out}")


if __name__ == "__main__":
    main()
