#!/usr/bin/env python
"""Wall and CPU time of a benchmark run with one shared prefill per sample against every item prefilling alone.

The two variants alternate (shared, alone, shared, ...) so that load on a shared machine hits both
alike; medians of wall time and of CPU time (the fairer figure on a loaded machine) are printed.
Everything after `--` goes to pytest unchanged:

    python scripts/measure/measure_shared_prefill.py --repeat 3 -- bench/test_ruler.py --kvbench-torch-threads 1 \\
        --kvbench-methods full,snapkv --kvbench-budgets 128,256 --kvbench-samples 4
"""

from __future__ import annotations

import argparse

from common import Timing, print_medians, print_ratio, timed_pytest

VARIANTS = {"shared prefill": [], "alone (--kvbench-no-share-prefill)": ["--kvbench-no-share-prefill"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds; medians are printed")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then the pytest arguments")
    args = parser.parse_args()
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    times: dict[str, list[Timing]] = {name: [] for name in VARIANTS}
    for _ in range(args.repeat):
        for name, extra in VARIANTS.items():
            times[name].append(timed_pytest(pytest_args + extra)[0])
    print(f"pytest {' '.join(pytest_args)}; rounds: {args.repeat}")
    shared, alone = print_medians(times).values()
    print_ratio("shared / alone", shared, alone)


if __name__ == "__main__":
    main()
