#!/usr/bin/env python
"""One layer's scoring (H2O, KVzip) or ragged decode steps (AdaKV), for copies of the code interleaved.

Issue 36 (item 4): on an H200, H2O's selection at 32k took 6.4 s (a plain prefill 1.3 s) and KVzip at 32k did
not finish in 150 s. Both are one kernel per layer over random tensors of a model's layer shape, so they are
timed here alone, without a model: `h2o` is `scoring.accumulated_attention` over a T-token layer, `kvzip` is
`kvzip_attention.attend_and_score` of one repeat chunk (`--chunk` context tokens plus 20 instruction tokens)
over a T-token context, with its output, at the block size kvzip.py picks for it. `ragged` is `--steps` decoding steps over one layer of AdaKV's
ragged cache (storage/ragged.py: the mask the per-layer hook asks for, the update, and sdpa over the padded
view with it), its KV heads keeping a skewed share of heads x 1,024 of the T tokens. Each round runs every
`--code DIR` copy (repeatable: e.g. `git archive main` unpacked, and this checkout) in a fresh process, one
after the other, so the neighbours' load falls on all alike; medians of wall and CPU seconds per call, the
new/old ratio and the load average are printed.

    python scripts/measure/measure_scoring_kernels.py --kernel h2o --shape qwen2.5-0.5b --tokens 8192 \\
        --dtype bfloat16 --rounds 3 --code /tmp/old --code .

`--kernel score --method NAME` times a built-in scorer's `score()` over one layer against the `score()` of its
kvpress press (the catalog's `kvpress_press`, at its defaults) on the same tensors, each round one fresh process
per side; run it with the Python of kvpress's environment (.ci/kvpress-env.sh). Prints press / native.

    /work/venvs/kvpress/bin/python scripts/measure/measure_scoring_kernels.py --kernel score --method keydiff \\
        --shape llama-3-8b --tokens 8192 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from common import require_positive

ROOT = Path(__file__).resolve().parents[2]
SHAPES = {"qwen2.5-0.5b": (14, 2, 64), "llama-3-8b": (32, 8, 128)}  # query heads, KV heads, head size


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", choices=["h2o", "kvzip", "ragged", "score"], required=True)
    parser.add_argument("--method", help="score: the built-in scorer timed against its kvpress press")
    parser.add_argument("--side", choices=["native", "press"], default="native", help=argparse.SUPPRESS)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--tokens", type=int, default=8192, help="the layer's (context's) length")
    parser.add_argument("--chunk", type=int, default=2048, help="kvzip: context tokens one repeat forward repeats")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--steps", type=int, default=64, help="ragged: decoding steps per call")
    parser.add_argument("--calls", type=int, default=1, help="calls per process (the minimum is kept)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--code", type=Path, action="append", help="a copy of the code (repeatable; default .)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    require_positive(parser, args, ("tokens", "chunk", "steps", "calls", "rounds", "threads"))
    if (args.kernel == "score") != bool(args.method):
        parser.error("--method goes with --kernel score, and --kernel score needs it")
    return args


def h2o_call(args, torch):
    from kvmethods.core.layer_inputs import LayerInputs
    from kvmethods.scorers.scoring import accumulated_attention

    q_heads, kv_heads, dim = SHAPES[args.shape]
    dtype, T = getattr(torch, args.dtype), args.tokens
    generator = torch.Generator().manual_seed(0)
    module = torch.nn.Module()
    module.config, module.scaling = SimpleNamespace(num_attention_heads=q_heads), dim**-0.5
    keys = torch.randn(1, kv_heads, T, dim, generator=generator).to(dtype)
    values = torch.randn(1, kv_heads, T, dim, generator=generator).to(dtype)
    queries = (torch.randn(1, T, q_heads * dim, generator=generator) * 2).to(dtype)
    layer = LayerInputs(module, 0, 1, torch.zeros(1, T, 1, dtype=dtype), torch.ones(1, T, dim, dtype=dtype),
                        torch.zeros(1, T, dim, dtype=dtype), keys, values, queries)
    return lambda: accumulated_attention(layer)


def kvzip_call(args, torch):
    import kvmethods.scorers.kvzip as kvzip
    from kvmethods.attention.kvzip_attention import RepeatSpan, attend_and_score

    q_heads, kv_heads, dim = SHAPES[args.shape]
    dtype, T, R = getattr(torch, args.dtype), args.tokens, args.chunk + 20
    generator = torch.Generator().manual_seed(0)
    query = (torch.randn(1, q_heads, R, dim, generator=generator) * 2).to(dtype)
    key = torch.randn(1, kv_heads, T + R, dim, generator=generator).to(dtype)
    value = torch.randn(1, kv_heads, T + R, dim, generator=generator).to(dtype)
    if hasattr(kvzip, "block_scratch"):  # the block kvzip.py picks (after issue 36), else its constant
        cache = SimpleNamespace(layers=[SimpleNamespace(keys=key)])
        scratch = kvzip.block_scratch(cache, kv_heads, q_heads // kv_heads, T + R)
    else:
        scratch = kvzip.SCRATCH_ELEMENTS
    start = (T // 2 // args.chunk) * args.chunk  # a middle chunk: other context on both sides
    span = RepeatSpan(T, start, min(T, start + args.chunk), 4, scratch, [])
    return lambda: attend_and_score(query, key, value, span, dim**-0.5)


def ragged_call(args, torch):
    import copy

    from kvmethods.storage.ragged import RaggedLayer

    q_heads, kv_heads, dim = SHAPES[args.shape]
    dtype, T = getattr(torch, args.dtype), args.tokens
    generator = torch.Generator().manual_seed(0)
    shares = torch.linspace(3.0, 0.25, kv_heads)  # a skewed allocation of kv_heads x 1,024 kept tokens
    counts = (shares / shares.sum() * kv_heads * min(1024, T // kv_heads)).long().clamp(1, T).tolist()
    kept = torch.zeros(1, kv_heads, T, dtype=torch.bool)
    for head, count in enumerate(counts):
        kept[0, head, torch.randperm(T, generator=generator)[:count]] = True
    keys = torch.randn(1, kv_heads, T, dim, generator=generator).to(dtype)
    layer = RaggedLayer(keys, torch.randn(1, kv_heads, T, dim, generator=generator).to(dtype), kept)
    steps = [tuple(torch.randn(1, heads, 1, dim, generator=generator).to(dtype) for heads in (q_heads, kv_heads, kv_heads))
             for _ in range(args.steps)]

    def decode():
        fresh = copy.deepcopy(layer)
        for query, key, value in steps:
            mask = fresh.attention_mask(1, q_heads, dtype)
            all_keys, all_values = fresh.update(key, value)
            groups = q_heads // kv_heads
            torch.nn.functional.scaled_dot_product_attention(
                query.view(1, kv_heads, groups, dim), all_keys, all_values, attn_mask=mask.view(1, kv_heads, groups, -1))

    return decode


def score_call(args, torch):
    """A built-in scorer's score() or its kvpress press's, over one random layer with working projections."""
    # lazy: the child's --code copy (its PYTHONPATH), and torch only in the child
    from kvmethods import get_method
    from kvmethods.core.catalog import BUILTINS
    from kvmethods.core.layer_inputs import LayerInputs

    q_heads, kv_heads, dim = SHAPES[args.shape]
    dtype, T, hidden = getattr(torch, args.dtype), args.tokens, q_heads * dim
    generator = torch.Generator().manual_seed(0)
    module = torch.nn.Module()
    module.config = SimpleNamespace(num_attention_heads=q_heads, num_key_value_heads=kv_heads, head_dim=dim)
    module.head_dim, module.scaling, module.layer_idx = dim, dim**-0.5, 0
    module.q_proj = torch.nn.Linear(hidden, q_heads * dim, bias=False, dtype=dtype)
    module.k_proj = torch.nn.Linear(hidden, kv_heads * dim, bias=False, dtype=dtype)
    states = torch.randn(1, T, hidden, generator=generator).to(dtype)
    keys = torch.randn(1, kv_heads, T, dim, generator=generator).to(dtype)
    values = torch.randn(1, kv_heads, T, dim, generator=generator).to(dtype)
    if args.side == "press":
        import kvpress  # lazy: kvpress's environment, --side press only

        press = getattr(kvpress, BUILTINS[args.method].kvpress_press)()
        return lambda: press.score(module, states, keys, values, None, {})
    angles = torch.arange(T).unsqueeze(-1) * 10000.0 ** (-torch.arange(0, dim, 2) / dim)
    cos, sin = (f(torch.cat([angles, angles], dim=-1)).unsqueeze(0).to(dtype) for f in (torch.cos, torch.sin))
    layer = LayerInputs(module, 0, 1, states, cos, sin, keys, values)
    method = get_method(args.method)
    return lambda: method.score(layer, T // 2)


def child(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    call = {"h2o": h2o_call, "kvzip": kvzip_call, "ragged": ragged_call, "score": score_call}[args.kernel](args, torch)
    best = None
    with torch.inference_mode():
        for _ in range(args.calls):
            wall, cpu = time.perf_counter(), time.process_time()
            call()
            timing = (time.perf_counter() - wall, time.process_time() - cpu)
            best = timing if best is None or timing[1] < best[1] else best
    print(json.dumps(best))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        return child(args)
    codes = [code.resolve() for code in args.code or [ROOT]]
    # --kernel score: one code, two sides (kvpress's press first, as "old")
    runs = [(code, "native") for code in codes] if args.kernel != "score" else [(codes[0], "press"), (codes[0], "native")]
    timings: dict[tuple, list] = {run: [] for run in runs}
    loads = []
    for _ in range(args.rounds):
        for code, side in runs:
            loads.append(os.getloadavg()[0])
            done = subprocess.run([sys.executable, __file__, "--child", "--side", side,
                                   *(sys.argv[1:] if argv is None else argv)],
                                  env=dict(os.environ, PYTHONPATH=str(code)), capture_output=True, text=True,
                                  check=True)
            timings[(code, side)].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{args.kernel if args.kernel != 'score' else args.method}, {args.shape} layer ({args.dtype}), {args.tokens} tokens"
          + (f", a {args.chunk}-token chunk" if args.kernel == "kvzip" else "")
          + (f", {args.steps} decoding steps" if args.kernel == "ragged" else "")
          + f", {args.threads} thread(s), {args.rounds} interleaved rounds, load average "
            f"{statistics.median(loads):.1f} (min {min(loads):.1f}, max {max(loads):.1f})")
    medians = {}
    for (code, side), rounds in timings.items():
        medians[(code, side)] = [statistics.median(run[i] for run in rounds) for i in (0, 1)]
        label = str(code) if args.kernel != "score" else f"{side} ({args.method})"
        print(f"{label:40s} wall {medians[(code, side)][0]:8.4f} s  CPU {medians[(code, side)][1]:8.4f} s  "
              f"(rounds: {', '.join(f'{run[1]:.4f}' for run in rounds)} CPU s)")
    if len(runs) == 2:
        old, new = (medians[run] for run in runs)
        print(f"{'new / old' if args.kernel != 'score' else 'native / press'}: wall {new[0] / old[0]:.2f}x, "
              f"CPU {new[1] / old[1]:.2f}x")


if __name__ == "__main__":
    main()
