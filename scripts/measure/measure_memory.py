"""Measure the memory axis (issue 16) on a random Llama where the cache dominates: chunked prefill's peak,
KIVI's prefill cost and decoding speed.

Model: a randomly initialised Llama, hidden 1024, 8 layers, 16 query / 4 KV heads (head_dim 64), MLP 2816,
float32 on CPU; prompt 16,384 tokens. Each method runs in a fresh subprocess (as scripts/measure/measure_methods.py:
fixed glibc mmap threshold, VmHWM reset through /proc/self/clear_refs after a warm-up): "growth" is the peak
resident memory during prefill + decoding above the resident size just before the prompt.

- chunked prefill: growth of `snapkv:prefill_chunk=512` over `snapkv` (both budget 1024); target <= 0.5;
- KIVI: prefill + quantization time of `kivi` over the plain prefill of `full`;
- decoding: tokens/s of `kivi` over `full` (the quantized cache is dequantized on every read).

    python scripts/measure/measure_memory.py [--prompt 16384] [--new-tokens 32] [--threads 2]

`--decode-only --rounds R` measures decoding alone, without the prompt's prefill (minutes at 16k tokens on a
CPU): each layer's cache is filled with random keys and values of the prompt's length (through the method's
storage: KIVI quantizes them), then `--new-tokens` greedy steps; CPU seconds per token, medians over R rounds
that interleave the methods, each in a fresh process. Attention costs the same whatever the cached values.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from common import prompt_ids, run_child, status_kib
from tabulate import tabulate
from transformers import DynamicCache

from kvmethods import get_method
from kvmethods.runtime.generation import PrefilledPrompt, decode_greedy, generate
from kvmethods.testing import tiny_model

MODEL = dict(hidden_size=1024, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4,
             intermediate_size=2816, vocab_size=32000, max_position_embeddings=32768)
RUNS = {  # label -> (method spec, params, budget)
    "full": ("full", {}, "1024"),
    "snapkv": ("snapkv", {}, "1024"),
    "snapkv:prefill_chunk=512": ("snapkv", {"prefill_chunk": 512}, "1024"),
    "kivi (2 bits)": ("kivi", {}, "1024"),
    "kivi:bits=4": ("kivi", {"bits": 4}, "1024"),
}


def child(label: str, length: int, new_tokens: int) -> dict:
    name, params, budget = RUNS[label]
    model, method = tiny_model("llama", **MODEL), get_method(name, **params)
    generate(model, method, budget, prompt_ids(600), 600, 2, set(), "question_in_window")  # warm-up
    ids = prompt_ids(length)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # reset VmHWM to the current resident size
    before = status_kib("VmRSS")
    started = time.process_time()
    out = generate(model, method, budget, ids, length, new_tokens, set(), "question_in_window")
    cpu = time.process_time() - started
    return {"growth_kib": status_kib("VmHWM") - before, "prefill_s": out.prefill_s, "decode_s": out.decode_s,
            "tokens": len(out.tokens), "kv_bytes": out.kv_bytes_physical, "cpu_s": cpu}


def decode_child(label: str, length: int, new_tokens: int) -> dict:
    """CPU seconds of `new_tokens` greedy steps over a cache of `length` random tokens per layer."""
    name, params, _ = RUNS[label]
    model, method = tiny_model("llama", **MODEL), get_method(name, **params)
    heads, head_dim = MODEL["num_key_value_heads"], MODEL["hidden_size"] // MODEL["num_attention_heads"]
    generator = torch.Generator().manual_seed(0)

    def prefilled(tokens: int) -> PrefilledPrompt:
        cache = DynamicCache()
        for layer in range(MODEL["num_hidden_layers"]):
            keys, values = (torch.randn(1, heads, tokens, head_dim, generator=generator) for _ in range(2))
            cache.update(keys, values, layer)
            stored = method.storage_layer(keys, values)
            if stored is not None:
                cache.layers[layer] = stored
        return PrefilledPrompt(cache, torch.randn(MODEL["vocab_size"], generator=generator), tokens, False)

    with torch.inference_mode():  # as generate() decodes
        decode_greedy(model, prefilled(600), 2, set(), method=method)  # warm-up
        state = prefilled(length)
        started = time.process_time()
        tokens = decode_greedy(model, state, new_tokens, set(), method=method)[0]
    return {"cpu_s_per_token": (time.process_time() - started) / len(tokens)}


def decode_only(args) -> None:
    labels = ["full", "kivi (2 bits)", "kivi:bits=4"]
    seconds = {label: [] for label in labels}
    for _ in range(args.rounds):
        for label in labels:
            seconds[label].append(measure(label, args, "--decode-child")["cpu_s_per_token"])
    medians = {label: statistics.median(values) for label, values in seconds.items()}
    print(f"decoding only: random Llama {MODEL}, float32, a {args.prompt}-token random cache, {args.new_tokens} "
          f"steps, {args.threads} thread(s), {args.rounds} interleaved rounds, torch {torch.__version__}")
    print(tabulate([[label, f"{1 / medians[label]:.2f}", f"{medians['full'] / medians[label]:.3f}",
                     " ".join(f"{1 / s:.2f}" for s in seconds[label])] for label in labels],
                   headers=["method", "tokens/CPU s (median)", "over full", "each round"]))


def measure(label: str, args, mode: str = "--child") -> dict:
    return run_child(__file__, [mode, label, "--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens),
                                "--threads", str(args.threads)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=16384)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decode-only", action="store_true", help="decoding alone, on a random cache")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (with --decode-only)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--decode-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for label, run in ((args.child, child), (args.decode_child, decode_child)):  # inside a fresh process
        if label:
            print(json.dumps(run(label, args.prompt, args.new_tokens)))
            return
    if args.decode_only:
        decode_only(args)
        return
    results = {label: measure(label, args) for label in RUNS}
    rows = [[label, f"{r['growth_kib'] / 1024:.0f}", f"{r['prefill_s']:.1f}", f"{r['tokens'] / r['decode_s']:.2f}",
             f"{r['kv_bytes'] / 2**20:.1f}"] for label, r in results.items()]
    print(f"random Llama {MODEL}, float32, prompt {args.prompt} tokens, {args.threads} thread(s), "
          f"torch {torch.__version__}")
    print(tabulate(rows, headers=["method", "peak growth MiB", "prefill s", "decode tokens/s", "KV MiB stored"]))
    chunked = results["snapkv:prefill_chunk=512"]["growth_kib"] / results["snapkv"]["growth_kib"]
    print(f"chunked (512) / unchunked peak growth, budget 1024: {chunked:.3f} (target <= 0.5)")
    for label in ("kivi (2 bits)", "kivi:bits=4"):
        prefill_ratio = results[label]["prefill_s"] / results["full"]["prefill_s"]
        decode_ratio = (results[label]["tokens"] / results[label]["decode_s"]) / \
            (results["full"]["tokens"] / results["full"]["decode_s"])
        print(f"{label}: prefill+quantization / plain prefill {prefill_ratio:.3f}; "
              f"decode tokens/s quantized / unquantized {decode_ratio:.3f}")


if __name__ == "__main__":
    main()
