#!/usr/bin/env python
"""Speed-up of one worker per core: the same 20-item grid with and without `-n 2`.

Each worker runs one torch thread (--kvbench-torch-threads 1), so two workers use the two cores
of the reference machine; the serial run gets the same single thread for a fair comparison of
scheduling, and a second serial run uses two threads, for reference. The parallel run uses the
documented `--dist loadgroup`: each task's items stay on one worker, so each full-cache reference
is computed once, as in the serial run.

    python scripts/measure_xdist.py            # prints wall times and the ratio
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GRID = ["--kvbench-methods", "full,streamingllm,snapkv,tova", "--kvbench-budgets", "32,64,128",
        "--kvbench-tasks", "niah_single_1,niah_multikey_2", "--kvbench-context-lengths", "2048",
        "--kvbench-samples", "20", "-p", "no:cacheprovider", "-q", "bench/test_ruler.py", "bench/test_longbench.py"]


def timed(*extra: str) -> float:
    with tempfile.TemporaryDirectory() as results:
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "pytest", *GRID, "--kvbench-results", results, *extra],
                              cwd=ROOT, env=env, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(proc.stdout[-3000:] + proc.stderr[-2000:])
    return elapsed


def main() -> None:
    serial_one = timed("--kvbench-torch-threads", "1")
    serial_all = timed("--kvbench-torch-threads", "2")
    parallel = timed("-n", "2", "--dist", "loadgroup", "--kvbench-torch-threads", "1")
    print(f"items: 20 (3 methods x 3 budgets + full, x 2 tasks), cores: {os.cpu_count()}")
    print(f"serial, 1 thread:      {serial_one:7.1f} s")
    print(f"serial, 2 threads:     {serial_all:7.1f} s")
    print(f"-n 2 --dist loadgroup, 1 thread each: {parallel:7.1f} s")
    print(f"speed-up vs serial 1 thread: {serial_one / parallel:.2f}x; vs serial 2 threads: {serial_all / parallel:.2f}x")


if __name__ == "__main__":
    main()
