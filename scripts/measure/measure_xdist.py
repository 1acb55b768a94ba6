#!/usr/bin/env python
"""Speed-up of one worker per core: the same 20-item grid with and without `-n 2`.

Each worker runs one torch thread (--kvbench-torch-threads 1), so two workers use the two cores
of the reference machine; the serial run gets the same single thread for a fair comparison of
scheduling, and a second serial run uses two threads, for reference. The parallel run uses the
documented `--dist loadgroup`: each task's items stay on one worker, so each full-cache reference
is computed once, as in the serial run.

    python scripts/measure/measure_xdist.py            # prints wall times and the ratio
    python scripts/measure/measure_xdist.py --repeat 3 # medians of 3 interleaved rounds (shared machines are noisy)
"""

from __future__ import annotations

import argparse
import os
import statistics

from common import wall_seconds

GRID = ["--kvbench-methods", "full,streamingllm,snapkv,tova", "--kvbench-budgets", "32,64,128",
        "--kvbench-tasks", "niah_single_1,niah_multikey_2", "--kvbench-context-lengths", "2048",
        "--kvbench-samples", "20", "bench/test_ruler.py", "bench/test_longbench.py"]


def timed(*extra: str) -> float:
    return wall_seconds([*GRID, *extra])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1, help="interleaved rounds; medians are printed")
    args = ap.parse_args()
    configs = {
        "serial, 1 thread": ("--kvbench-torch-threads", "1"),
        "serial, 2 threads": ("--kvbench-torch-threads", "2"),
        "-n 2 --dist loadgroup, 1 thread each": ("-n", "2", "--dist", "loadgroup", "--kvbench-torch-threads", "1"),
    }
    times: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(args.repeat):
        for name, extra in configs.items():
            times[name].append(timed(*extra))
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"items: 20 (3 methods x 3 budgets + full, x 2 tasks), cores: {os.cpu_count()}, rounds: {args.repeat}")
    for name, values in times.items():
        print(f"{name:38s} median {median[name]:6.1f} s  ({', '.join(f'{v:.1f}' for v in values)})")
    serial_one, serial_all, parallel = median.values()
    print(f"speed-up vs serial 1 thread: {serial_one / parallel:.2f}x; vs serial 2 threads: {serial_all / parallel:.2f}x")


if __name__ == "__main__":
    main()
