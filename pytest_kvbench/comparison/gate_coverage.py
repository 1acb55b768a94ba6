"""Exit 1 unless every entry of a baseline was compared by the run that gated on it.

The gate (`--kvbench-compare`) reports items without a baseline entry as new and lists entries that did not
run, without failing: right for a growing grid, but a CI gate whose model label or task changed would then
pass while comparing nothing. CI scripts call this after the gated run:

    python -m pytest_kvbench.comparison.gate_coverage RESULTS_DIR BASELINE.json
"""

from __future__ import annotations

import argparse
import sys

from pytest_kvbench.comparison.baseline_file import load_baseline
from pytest_kvbench.results.runs import load_run


def uncompared(records: list, baseline_keys: set[str]) -> list[str]:
    """Baseline keys that no record of the run was judged against (judged: a verdict other than new)."""
    judged = {r.key for r in records if (r.verdict or {}).get("status") not in (None, "new")}
    return sorted(baseline_keys - judged)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="the --kvbench-results directory of the gated run")
    parser.add_argument("baseline")
    args = parser.parse_args(argv)
    try:
        records = load_run("latest", args.results).records
        keys = set(load_baseline(args.baseline).entries)
    except ValueError as exc:  # RunError, BaselineError: one line each
        parser.exit(2, f"check_gate_coverage: {exc}\n")
    missing = uncompared(records, keys)
    if missing:
        print(f"{len(missing)} of {len(keys)} baseline entries were not compared (renamed model or task?): "
              + ", ".join(missing), file=sys.stderr)
        return 1
    print(f"all {len(keys)} baseline entries compared")
    return 0


if __name__ == "__main__":
    sys.exit(main())
