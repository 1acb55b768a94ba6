"""``kvbench coverage`` without a run: the matrix of what the CI gates cover (comparison/product_coverage.py),
read from the gates' baseline files, and exit 1 when a built-in method, budget kind or protocol has no gate entry
that can fail. Loads no torch: the catalog and baselines are plain data."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tabulate import tabulate

from pytest_kvbench import user_paths
from pytest_kvbench.cli_checks import UsageError
from pytest_kvbench.commands.common import EXIT_OK, EXIT_REGRESSION
from pytest_kvbench.comparison.baseline_file import load_baseline
from pytest_kvbench.comparison.product_coverage import (BASELINE_GLOB, MATRIX_HEADERS, NOT_GATED, as_json, covers,
                                                        gaps, gaps_message, gate_name, matrix_rows)
from pytest_kvbench.comparison.tolerances import parse_tolerances


def gate_files(args) -> list[Path]:
    """--baseline FILE (repeatable), else every baseline*.json of the results directory; one of them is needed."""
    if args.gate_baselines:
        for spec in args.gate_baselines:
            try:
                user_paths.checked(spec, "--baseline")
            except user_paths.PathError as exc:
                raise UsageError(str(exc)) from None
        return [Path(spec) for spec in args.gate_baselines]
    found = sorted(Path(args.results).glob(BASELINE_GLOB))
    if not found:
        raise UsageError(f"no gate baseline ({BASELINE_GLOB}) in {args.results}; name them with --baseline FILE")
    return found


def cmd_gate_matrix(args) -> int:
    files = gate_files(args)
    names = [gate_name(path) for path in files]
    if len(set(names)) < len(names):
        raise UsageError("two --baseline files share a name: " + ", ".join(str(f) for f in files))
    baselines = {gate_name(path): load_baseline(path) for path in files}
    cells = covers(baselines, parse_tolerances(None))
    found = gaps(cells)
    if args.json:
        print(json.dumps(as_json(cells, found, {gate_name(f): str(f) for f in files}), indent=2))
    else:
        print("what the CI gates cover: the most sensitive entry of each cell and the smallest change it detects "
              "(a score drop in points at the default tolerances, or the fidelity metrics that gate it)")
        print("gates: " + ", ".join(f"{gate_name(f)} ({f}, {len(baselines[gate_name(f)].entries)} entries)"
                                    for f in files))
        print(tabulate(matrix_rows(cells), headers=MATRIX_HEADERS, tablefmt="github", disable_numparse=True))
        for method, why in NOT_GATED.items():
            print(f"not gated: {method}: {why}")
    if found or not args.json:  # --json: stdout holds the JSON document alone
        print(gaps_message(found), file=sys.stderr if found else sys.stdout)
    return EXIT_REGRESSION if found else EXIT_OK
