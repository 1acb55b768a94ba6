#!/usr/bin/env python
"""Each native method's selection against its kvpress press's, on the same model and prompt (kvpress's environment).

Issue 49 asks that a method built after a kvpress press selects no slower than the press (target <= 1.1x). Both
compress inside one prefill forward, so each is timed as a whole prefill of the same prompt at the same budget,
interleaved with a plain prefill (`full`) round by round; a method's selection costs its prefill minus the plain
one (medians over rounds, CPU seconds of this process on one thread: on a shared machine the fairer figure). The
model is kvmethods.testing's bench model (hidden 256, 4 layers, 8 query / 2 KV heads of 32, float32); ours run at
the press's defaults. Run with kvpress installed:

    PYTHONPATH=. /path/to/kvpress-env/bin/python scripts/measure/measure_press_selection.py --tokens 4096 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from common import ROOT  # noqa: F401 (this checkout's packages first on sys.path)

from kvmethods import Budget, get_method
from kvmethods.runtime.generation import prefill
from kvmethods.testing import bench_model

# name -> (our spec and parameters at the press's defaults, the press's adapter spec and parameters)
PAIRS = {
    "snapkv": (("snapkv", {"window": 64, "kernel": 5}), ("kvpress:SnapKVPress", {})),
    "chunkkv": (("chunkkv", {"window": 64, "kernel": 5, "chunk_length": 20}),
                ("kvpress:ChunkKVPress", {"press": "SnapKVPress"})),
    "merge": (("merge", {"window": 64, "kernel": 5}), ("kvpress:MergingPress", {"press": "SnapKVPress"})),
    "capkv": (("capkv", {}), ("kvpress:CapPress", {})),
}


def cpu_seconds(model, method, budget: Budget, ids: list[int]) -> float:
    start = time.process_time()
    prefill(model, method, budget, ids, len(ids), "question_in_window")
    return time.process_time() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096, help="prompt length")
    parser.add_argument("--budget", default="r0.5")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model, budget = bench_model(), Budget.parse(args.budget)
    ids = torch.randint(5, 32000, (args.tokens,), generator=torch.Generator().manual_seed(0)).tolist()
    full = get_method("full")
    print(f"{args.tokens} tokens, budget {args.budget}, {args.rounds} rounds; load average {os.getloadavg()[0]:.1f}")
    print("| method | plain prefill, CPU s | ours: selection, CPU s | press: selection, CPU s | ours / press |")
    print("|---|---|---|---|---|")
    for name, ((ours, our_params), (press, press_params)) in PAIRS.items():
        plain, mine, theirs = [], [], []
        for _ in range(args.rounds):
            plain.append(cpu_seconds(model, full, budget, ids))
            mine.append(cpu_seconds(model, get_method(ours, **our_params), budget, ids))
            theirs.append(cpu_seconds(model, get_method(press, **press_params), budget, ids))
        base = statistics.median(plain)
        own, other = statistics.median(mine) - base, statistics.median(theirs) - base
        print(f"| {name} | {base:.3f} | {own:.3f} | {other:.3f} | {own / other:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
