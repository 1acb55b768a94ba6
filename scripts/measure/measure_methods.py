"""Print prefill+compression cost of each method relative to a plain prefill (time and peak memory).

Target (issue 3): on a tiny Llama (hidden 256, 4 layers, 8 query / 2 KV heads) on CPU with a prompt of
at least 4,096 tokens, prefill+compression / plain prefill <= 1.10 in time for snapkv, pyramidkv, tova,
knorm and streamingllm, <= 1.5 for h2o, and <= 1.15 in peak memory for all. Issue 15: <= 1.15 in time for
adakv (over snapkv), criticalkv and expected_attention, <= 2.2 for kvzip (its reconstruction forward is
part of its cost; "scoring share" is that forward's part of the time), and for adakv, whose cache is
ragged, physical / logical KV bytes <= 1.05.

"Plain prefill" is the same call with the `full` method: a DynamicCache forward over the prompt keeping
only the last logits (as model.generate does). Times are process CPU seconds (single-threaded, so equal to
the compute time whatever else runs on the machine), the minimum over interleaved repeats. Peak memory is
measured in a fresh subprocess per method from the kernel's resident-set high-water mark (VmHWM, reset
through /proc/self/clear_refs after a short warm-up): "extra" is the peak above the resident size just
before the prefill (activations + cache + scoring scratch), "process" includes the interpreter and weights.
The children run with a fixed glibc mmap threshold so that freed tensors leave the resident set at once.

`--model mlp-bound` measures a random Llama whose linear layers dominate the prefill (hidden 1024, MLP
4096, 4 layers, 16 query / 4 KV heads of 64), closer to the 7-8B models of the papers than the tiny bench
model, on which attention dominates at 4,096 tokens. `--model llama3-8b-layers` has Llama-3-8B's layer shapes
(hidden 4096, MLP 14336, 32 query / 8 KV heads of 128), the papers' setting, with `--layers` of them (4 by
default: each prefill is ~2 TFLOP per layer, minutes on a CPU). KVzip's repeat forward stops after the last
layer's scores, so its cost per layer depends on the layer count; `--layers 2` and `--layers 4` give the
per-layer costs that `kvzip_extrapolated` (printed when both runs are named with `--extrapolate`) turns into
the ratio of the 32-layer model. `--no-memory` skips the peak-memory children (each repeats a prefill).

    python scripts/measure/measure_methods.py [--model bench|mlp-bound|llama3-8b-layers] [--layers N] [--prompt 4096]
                                      [--budget 1024] [--repeats 5] [--threads 1] [--no-memory]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from common import prompt_ids, require_positive, run_child, status_kib
from tabulate import tabulate

from kvmethods import MethodError, get_method
from kvmethods.runtime.generation import prefill
from kvmethods.storage.ragged import cache_bytes
from kvmethods.testing import BENCH_MODEL, tiny_model

METHODS = ["snapkv", "pyramidkv", "tova", "knorm", "streamingllm", "random", "h2o", "adakv", "criticalkv",
           "expected_attention", "kvzip"]
TIME_TARGETS = {"h2o": 1.5, "random": None, "adakv": 1.15, "criticalkv": 1.15, "expected_attention": 1.15,
                "kvzip": 2.2}  # random: no target in the issue
MAX_LAYERS = 128  # deeper random models would only exhaust memory: the layer count is for extrapolation
BYTES_TARGET = 1.05  # physical / logical KV bytes (adakv's ragged storage)
MODELS = {
    "bench": BENCH_MODEL,
    "mlp-bound": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=4, num_attention_heads=16,
                      num_key_value_heads=4, vocab_size=32000),
    "llama3-8b-layers": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=4, num_attention_heads=32,
                             num_key_value_heads=8, vocab_size=32000),
}


def model_shape(name: str, layers: int | None = None) -> dict:
    return MODELS[name] | ({"num_hidden_layers": layers} if layers else {})


def load_model(name: str, layers: int | None = None):
    return tiny_model("llama", seed=0, **model_shape(name, layers))


def kvzip_extrapolated(runs: dict[int, tuple[float, float]], layers: int) -> float:
    """kvzip / plain prefill for a model of `layers` layers, from runs {L: (plain CPU s, kvzip CPU s)} at two
    layer counts: a plain prefill costs L x p, kvzip's extra (L - 1) x r + r_last (the last layer only
    scores), so two counts give p, r and r_last."""
    (small, (plain_small, kvzip_small)), (large, (plain_large, kvzip_large)) = sorted(runs.items())[:2]
    per_layer_plain = (plain_large - plain_small) / (large - small)
    per_layer_repeat = ((kvzip_large - plain_large) - (kvzip_small - plain_small)) / (large - small)
    last_layer = (kvzip_small - plain_small) - (small - 1) * per_layer_repeat
    fixed_plain = plain_small - small * per_layer_plain  # embedding, final norm, the last position's logits
    return 1 + ((layers - 1) * per_layer_repeat + last_layer) / (layers * per_layer_plain + fixed_plain)


def run_prefill(model, method_name: str, budget: str, ids: list[int]) -> float:
    """CPU seconds of one prefill (+ compression): immune to other processes sharing the cores."""
    return timed_prefill(model, method_name, budget, ids)[0]


def timed_prefill(model, method_name: str, budget: str, ids: list[int]):
    """(CPU seconds, wall-clock share of a whole-prompt scoring pass, (logical, physical) KV bytes)."""
    started, wall = time.process_time(), time.perf_counter()
    state = prefill(model, get_method(method_name), budget, ids, len(ids), "question_in_window")
    cpu, wall = time.process_time() - started, time.perf_counter() - wall
    return cpu, state.scoring_s / wall, cache_bytes(state.cache)


def memory_child(model_name: str, method_name: str, budget: str, length: int, layers: int | None = None) -> dict:
    model = load_model(model_name, layers)
    run_prefill(model, method_name, budget, prompt_ids(256))  # load kernels and code paths
    ids = prompt_ids(length)
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # reset VmHWM to the current resident size
    before = status_kib("VmRSS")
    run_prefill(model, method_name, budget, ids)
    peak = status_kib("VmHWM")
    return {"before_kib": before, "peak_kib": peak, "extra_kib": peak - before}


def measure_memory(method_name: str, args) -> dict:
    layers = ["--layers", str(args.layers)] if args.layers else []
    return run_child(__file__, ["--memory-child", method_name, "--model", args.model, *layers, "--prompt", str(args.prompt),
                                "--budget", args.budget, "--threads", str(args.threads)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="bench")
    parser.add_argument("--prompt", type=int, default=4096)
    parser.add_argument("--budget", default="1024")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--layers", type=int, help="decoder layers of the model (default: the model's own)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory children")
    parser.add_argument("--extrapolate", nargs=2, metavar="L:PLAIN_S:KVZIP_S",
                        help="two runs' (layers, plain, kvzip CPU s): print kvzip's ratio at 32 layers and exit")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    require_positive(parser, args, ("prompt", "repeats", "threads"))
    try:
        for name in args.methods.split(","):
            get_method(name)
    except MethodError as error:
        parser.error(f"--methods: {error}")
    if args.layers is not None and not 1 <= args.layers <= MAX_LAYERS:
        parser.error(f"--layers must be an integer from 1 to {MAX_LAYERS}")
    if args.extrapolate:
        try:
            runs = {int(layers): (float(plain), float(kvzip))
                    for layers, plain, kvzip in (run.split(":") for run in args.extrapolate)}
        except ValueError:
            parser.error("--extrapolate takes two LAYERS:PLAIN_S:KVZIP_S runs, e.g. 2:43.0:70.2 4:81.1:157.9")
        if len(runs) != 2 or min(runs) < 1:
            parser.error("--extrapolate needs runs at two different positive layer counts")
        if not all(0 < seconds < math.inf for run in runs.values() for seconds in run):
            parser.error("--extrapolate: CPU seconds must be positive finite numbers")
        print(f"kvzip / plain prefill at 32 layers: {kvzip_extrapolated(runs, 32):.3f}")
        return
    torch.set_num_threads(args.threads)
    if args.memory_child:
        print(json.dumps(memory_child(args.model, args.memory_child, args.budget, args.prompt, args.layers)))
        return

    methods = args.methods.split(",")
    model, ids = load_model(args.model, args.layers), prompt_ids(args.prompt)
    for name in ["full", *methods]:
        run_prefill(model, name, args.budget, ids[:512])  # warm-up
    times: dict[str, list[float]] = {name: [] for name in ["full", *methods]}
    scoring_share, kv_bytes = {}, {}
    for _ in range(args.repeats):
        for name in times:
            cpu, scoring_share[name], kv_bytes[name] = timed_prefill(model, name, args.budget, ids)
            times[name].append(cpu)
    plain_time = min(times["full"])
    skipped = {"extra_kib": float("nan"), "peak_kib": float("nan")}
    plain_memory = skipped if args.no_memory else measure_memory("full", args)

    rows = []
    for name in methods:
        memory = skipped if args.no_memory else measure_memory(name, args)
        time_ratio = min(times[name]) / plain_time
        extra_ratio = memory["extra_kib"] / plain_memory["extra_kib"]
        process_ratio = memory["peak_kib"] / plain_memory["peak_kib"]
        target = TIME_TARGETS.get(name, 1.10)
        logical, physical = kv_bytes[name]
        rows.append([name, f"{min(times[name]):.3f}", f"{time_ratio:.3f}",
                     "-" if target is None else ("ok" if time_ratio <= target else "OVER") + f" (<= {target})",
                     f"{scoring_share[name]:.2f}" if scoring_share[name] else "-",
                     f"{memory['extra_kib'] / 1024:.1f}", f"{extra_ratio:.3f}", f"{process_ratio:.3f}",
                     "-" if args.no_memory else "ok" if extra_ratio <= 1.15 else "OVER",
                     f"{physical / logical:.3f}" + ("" if physical <= BYTES_TARGET * logical else " OVER")])
    print(f"random Llama {model_shape(args.model, args.layers)}, prompt {args.prompt} tokens, budget {args.budget}, "
          f"{args.threads} thread(s), torch {torch.__version__}")
    print(f"plain prefill: {plain_time:.3f} CPU s (min of {args.repeats}); peak {plain_memory['extra_kib'] / 1024:.1f} MiB "
          f"above the loaded model (process peak {plain_memory['peak_kib'] / 1024:.1f} MiB)")
    print(tabulate(rows, headers=["method", "prefill+compress CPU s", "time ratio", "time target", "scoring share",
                                  "extra peak MiB", "memory ratio (extra)", "memory ratio (process)", "memory <= 1.15",
                                  "KV bytes physical/logical"]))


if __name__ == "__main__":
    main()
