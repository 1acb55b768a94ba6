"""The ``kvbench`` verbs that judge runs: ``compare`` (a run against a run or a baseline file), ``coverage``
(every baseline entry compared; without a run, the gates' coverage matrix: coverage_matrix.py), ``variance`` (seeds needed)."""

from __future__ import annotations

import sys
from pathlib import Path

from tabulate import tabulate

from pytest_kvbench import user_paths
from pytest_kvbench.cli_checks import UsageError
from pytest_kvbench.commands.common import EXIT_OK, EXIT_REGRESSION, load
from pytest_kvbench.commands.coverage_matrix import cmd_gate_matrix
from pytest_kvbench.comparison.baseline_file import Baseline, BaselineError, check_same_protocols, load_baseline
from pytest_kvbench.comparison.gate_coverage import coverage_message, uncompared
from pytest_kvbench.comparison.power import power_lines
from pytest_kvbench.comparison.tolerances import parse_tolerances
from pytest_kvbench.comparison.benchmark_changes import without_fingerprint_note
from pytest_kvbench.comparison.verdict_format import comparison_summary, comparison_table, score_alone_note
from pytest_kvbench.comparison.verdicts import compare_record
from pytest_kvbench.results.run import storage
from pytest_kvbench.results.run.environment import environment_differences


def _load_reference(args, spec: str) -> tuple[Baseline, str]:
    """``compare``'s first argument: a run (id, prefix or directory) or a saved baseline file."""
    try:
        user_paths.checked(spec, "baseline")
    except user_paths.PathError as exc:
        raise UsageError(str(exc)) from None
    path = Path(spec)
    if path.is_file() and path.name not in (storage.RUN_FILE, storage.RECORDS_FILE):
        baseline = load_baseline(path)
        return baseline, f"baseline file {path}"
    run = load(args, spec)
    args.compared.append(run)
    return Baseline.from_records(run.records, run.environment, source=run.run_id), f"run {run.run_id}"


def cmd_compare(args) -> int:
    tolerances = parse_tolerances(args.fail)
    args.compared = []
    baseline, baseline_name = _load_reference(args, args.baseline)
    current = load(args, args.current)
    for run in {r.path: r for r in [*args.compared, current]}.values():  # a verdict against an unfinished run is partial
        print(f"run {run.run_id} is {run.state.label()}")
    if not baseline.entries:
        raise BaselineError(f"{baseline_name} has no scored items to compare against")
    check_same_protocols(baseline.entries.values(), current.records, baseline_name, current.run_id)
    verdicts = [compare_record(r, baseline.entry(r), tolerances, seed=args.seed)
                for r in sorted(current.records, key=lambda r: r.key)]
    unrun = baseline.unrun(r.key for r in current.records)
    print(f"comparing run {current.run_id} against {baseline_name}; tolerances: {tolerances}")
    notes = environment_differences(baseline.environment, current.environment)
    if notes:
        print("environment changed: " + "; ".join(notes))
    print()
    print(comparison_table(verdicts))
    print()
    print(comparison_summary(verdicts, unrun))
    for note in (score_alone_note(baseline, tolerances), without_fingerprint_note(baseline)):
        if note:
            print(note)
    print("\n" + "\n".join(power_lines(baseline.entries.values(), tolerances, seed=args.seed)))
    for verdict in verdicts:
        if verdict.failed:
            print(f"{verdict.status.upper()} {verdict.message}")
    failed = any(v.failed for v in verdicts)
    if args.strict and any(v.status == "mismatch" for v in verdicts):
        failed = True
    return EXIT_REGRESSION if failed else EXIT_OK


def cmd_coverage(args) -> int:
    """With RUN and BASELINE: every baseline entry judged by RUN's gate; without: the gates' coverage matrix."""
    if args.run is None:
        if args.baseline_file is None:
            return cmd_gate_matrix(args)
    if args.baseline_file is None:
        raise UsageError("give RUN and BASELINE (the gate's coverage of its baseline), or neither (the gates' "
                         "coverage of the product)")
    if args.gate_baselines or args.json:
        raise UsageError("--baseline and --json belong to the matrix (kvbench coverage without RUN BASELINE)")
    try:
        user_paths.checked(args.baseline_file, "BASELINE")
    except user_paths.PathError as exc:
        raise UsageError(str(exc)) from None
    run = load(args, args.run)
    keys = set(load_baseline(args.baseline_file).entries)
    missing = uncompared(run.records, keys)
    print(coverage_message(missing, keys), file=sys.stderr if missing else sys.stdout)
    return EXIT_REGRESSION if missing else EXIT_OK


def cmd_variance(args) -> int:
    # lazy for startup time: numpy and scipy (every kvbench command pays its imports)
    from pytest_kvbench.comparison.seed_variance import HEADERS, parse_fraction, variance_groups, variance_rows
    from pytest_kvbench.stats import variation_curve

    threshold = parse_fraction(args.threshold)
    runs = [load(args, r) for r in args.runs]
    curves = [(key, variation_curve(values, threshold)) for key, values in variance_groups(runs).items()]
    rows = variance_rows(curves)
    print(f"coefficient of variation of the mean score against the number of seeds; threshold {100 * threshold:g}%")
    print(tabulate(rows, headers=HEADERS, disable_numparse=True))
    if args.plot.lower() != "none":
        # lazy for startup time: matplotlib
        from pytest_kvbench.results.report.figures import save_figure, variance_figure

        save_figure(variance_figure([(k, c) for k, c in curves if c.n >= 2]), args.plot)
        print(f"wrote {args.plot}")
    return EXIT_OK
