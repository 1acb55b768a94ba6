"""The ``kvbench`` command: find, inspect, compare, export, report and merge past runs.

Researchers should not need scripts to work with their results, and CI should be able to gate
outside pytest, so every verb works on the run directories under ``results/runs/``. Exit codes
are a contract: 0 success, 1 a regression found by ``compare``, 2 bad input (unknown or
ambiguous run id, corrupt file, bad option, an output path that cannot be written; all checked
before anything is printed), always with a one-line message and no traceback. A damaged run
(results/run/state.py) is read as far as it goes, then named in one line, and exits 2 too.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from tabulate import tabulate

from pytest_kvbench import atomic_files, model_listing, user_paths
from pytest_kvbench.comparison.baseline_file import Baseline, BaselineError, check_same_protocols, load_baseline
from pytest_kvbench.comparison.gate_coverage import coverage_message, uncompared
from pytest_kvbench.comparison.seed_variance import VarianceError
from pytest_kvbench.comparison.tolerances import parse_tolerances
from pytest_kvbench.comparison.verdicts import compare_record, comparison_summary, comparison_table, score_alone_note
from pytest_kvbench import cli_clean, model_listing, user_paths
from pytest_kvbench.cli_checks import (UsageError, check_no_blank_arguments, check_output_paths,
                                      check_results_dir)
from pytest_kvbench.results.run import storage
from pytest_kvbench.results.exports.directory import DIRECTORY_FORMATS
from pytest_kvbench.results.run.environment import environment_differences
from pytest_kvbench.results.views.export import FORMATS, ExportError, export_records, to_markdown
from pytest_kvbench.results.run.merge import merge_runs
from pytest_kvbench.results.exports.formats import export_directory
from pytest_kvbench.results.record import Record
from pytest_kvbench.results.report.html_report import ReportError
from pytest_kvbench.results.run.reproduction import reproduction_text
from pytest_kvbench.results.run.directories import Run, RunError, list_runs, load_run
from pytest_kvbench.tasks import TaskError
from pytest_kvbench.tasks.registry import task_listing

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE = 0, 1, 2
DEFAULT_RESULTS = "results"
MiB = 2**20


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2) instead of usage + error."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# -- verbs ------------------------------------------------------------------------------------


def _fmt(value, digits: int = 2, scale: float = 1.0) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return "-"
    return f"{value / scale:.{digits}f}"


def cmd_list(args) -> int:
    infos = list_runs(args.results)
    if args.json:
        print(json.dumps([{
            "run_id": i.run_id, "path": str(i.path), "date": i.date.isoformat() if i.date else None,
            "models": list(i.models), "methods": list(i.methods), "budgets": list(i.budgets), "tasks": list(i.tasks),
            "commit": i.commit, "items": i.n_records, "complete": i.complete, "state": i.state or None,
            "problem": i.problem,
        } for i in infos], indent=2))
        return EXIT_OK
    if not infos:
        print(f"no runs under {Path(args.results) / 'runs'}")
        return EXIT_OK
    rows = []
    for i in infos:
        date = i.date.strftime("%Y-%m-%d %H:%M") if i.date else "-"
        if i.problem:
            rows.append([i.run_id, date, "", "", "", "", "", "", f"unreadable: {i.problem}"])
            continue
        rows.append([i.run_id, date, ", ".join(i.models), ", ".join(i.methods), ", ".join(i.budgets),
                     ", ".join(i.tasks), (i.commit or "-")[:10], i.n_records, i.state])
    print(tabulate(rows, headers=["run", "date", "models", "methods", "budgets", "tasks", "commit", "items", "state"],
                   disable_numparse=True))
    return EXIT_OK


def _reproduce_lines(run: Run) -> list[str]:
    sources = run.info.get("merged_from") if isinstance(run.info.get("merged_from"), list) else None
    if sources:
        lines = [f"# {run.run_id} was merged by `kvbench merge` from {len(sources)} runs; each was made by:"]
        for source in sources:
            env = source.get("environment") or {}
            lines += [f"# -- {source.get('run_id')}"] + _commands(env, source.get("run_id"))
        return lines
    return _commands(run.environment, run.run_id)


def _commands(env: dict, run_id: str | None) -> list[str]:
    command, commit, cwd = env.get("command"), env.get("git_commit"), env.get("cwd")
    if not command:
        raise RunError(f"run {run_id} does not record the command that made it (no environment.command in run.json)")
    lines = []
    if commit:
        if env.get("git_dirty"):
            lines.append("# warning: the working tree had uncommitted changes; they are not part of the commit")
        lines.append(f"git checkout {commit}")
    else:
        lines.append("# commit unknown (the run was not made in a git checkout)")
    if cwd:
        lines.append(f"cd {shlex.quote(str(cwd))}")
    lines.append(command)
    return lines


def _device_line(records: list[Record]) -> str:
    """What the run's items ran on: GPU name and driver, or CPU model and threads (from the records)."""
    described = []
    for r in records:
        device = r.device
        if not device.name:
            continue
        details = [str(device.type)] if device.type else []
        if device.driver:
            details.append(f"driver {device.driver}")
        elif device.threads:
            details.append(f"{device.threads} thread(s)")
        text = device.name + (f" ({', '.join(details)})" if details else "")
        if text not in described:
            described.append(text)
    return "; ".join(described) or "-"


def cmd_tasks(args) -> int:
    try:
        rows = task_listing(args.suite)
    except TaskError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [[r["task"], r["suite"], r["metric"], r["max_new_tokens"], r["source"], r["missing"] or "yes"] for r in rows]
    print(tabulate(table, headers=["task", "suite", "metric", "max new tokens", "data", "available"], tablefmt="github"))
    return 0


def _load(args, spec: str) -> Run:
    """A run for a read command; a damaged one is remembered: main() names it and exits 2 at the end."""
    run = load_run(spec, args.results)
    if run.state.damaged and all(r.path != run.path for r in args.damaged):
        args.damaged.append(run)
    return run


def cmd_show(args) -> int:
    run = _load(args, args.run)
    if args.reproduce:
        print("\n".join(_reproduce_lines(run)))
        return EXIT_OK
    statuses: dict[str, int] = defaultdict(int)
    for r in run.records:
        statuses[str(r.status or "unknown")] += 1
    info = run.info
    print(f"run {run.run_id} ({run.state.label()})")
    print(f"path: {run.path}")
    print(f"date: {run.started or '-'}   duration: {_fmt(info.get('duration_s'), 1)} s")
    print(f"commit: {run.commit or '-'}{' (dirty)' if run.dirty else ''}")
    print(f"command: {run.command or '-'}")
    print(f"device: {_device_line(run.records)}")
    print("items: " + str(len(run.records)) + (" (" + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) + ")" if statuses else ""))
    if run.scored_records:
        print()
        print(to_markdown(run.records).rstrip())
    rows = []
    for r in sorted(run.records, key=lambda r: r.key):
        latency, memory = r.latency, r.memory
        rows.append([r.item_id or r.key, "-" if r.seed is None else r.seed, r.status or "-", _fmt(r.score),
                     "-" if r.n_samples is None else r.n_samples, _fmt(latency.total_s, 3), _fmt(memory.peak_bytes, 1, MiB),
                     _fmt(memory.kv_bytes_after, 2, MiB), _fmt(memory.compression_ratio, 2)])
    if rows:
        print()
        print(tabulate(rows, headers=["item", "seed", "status", "score", "samples", "latency s", "peak MiB", "KV MiB",
                                      "compression"], disable_numparse=True))
    problems = [r for r in run.records if r.status in ("failed", "error") and r.message]
    for r in problems:
        print(f"{r.status}: {r.item_id or r.key}: {str(r.message).splitlines()[0]}")
    for u in run.state.unfinished_items:  # the state's own list (results/run/state.py), as every command reads it
        print(f"not finished: {u.get('item_id')}: {u.get('reason')}")
    for c in run.state.crashed:
        print(f"crashed, then run again: {c.get('item_id')}: {c.get('message')}")
    if run.state.unfinished_items and info.get("resume_command"):
        print(f"finish the run with: {info['resume_command']}")
    elif not run.state.complete and not run.state.damaged:
        print(f"finish the run with: {run.command or 'pytest bench/'} --kvbench-resume {run.run_id}")
    print()
    print("environment:")
    for name, value in sorted(run.environment.items()):
        if name == "packages":
            value = f"{len(value)} recorded (kvbench env {run.run_id})"
        elif isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        print(f"  {name}: {value}")
    return EXIT_OK


def cmd_env(args) -> int:

    run = _load(args, args.run)
    try:
        commands = _reproduce_lines(run)
    except RunError as exc:
        commands = [f"# {exc}"]
    sys.stdout.write(reproduction_text(run, commands))
    return EXIT_OK


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
    run = _load(args, spec)
    args.compared.append(run)
    return Baseline.from_records(run.records, run.environment, source=run.run_id), f"run {run.run_id}"


def cmd_compare(args) -> int:
    tolerances = parse_tolerances(args.fail)
    args.compared = []
    baseline, baseline_name = _load_reference(args, args.baseline)
    current = _load(args, args.current)
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
    note = score_alone_note(baseline, tolerances)
    if note:
        print(note)
    for verdict in verdicts:
        if verdict.failed:
            print(f"{verdict.status.upper()} {verdict.message}")
    failed = any(v.failed for v in verdicts)
    if args.strict and any(v.status == "mismatch" for v in verdicts):
        failed = True
    return EXIT_REGRESSION if failed else EXIT_OK


def cmd_coverage(args) -> int:
    try:
        user_paths.checked(args.baseline_file, "BASELINE")
    except user_paths.PathError as exc:
        raise UsageError(str(exc)) from None
    run = _load(args, args.run)
    keys = set(load_baseline(args.baseline_file).entries)
    missing = uncompared(run.records, keys)
    print(coverage_message(missing, keys), file=sys.stderr if missing else sys.stdout)
    return EXIT_REGRESSION if missing else EXIT_OK


def _write_output(path: str, text: str, what: str) -> None:
    try:
        atomic_files.atomic_write_text(path, text)
    except OSError as exc:
        raise UsageError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
    print(f"wrote {path}", file=sys.stderr)


def cmd_export(args) -> int:
    run = _load(args, args.run)
    if args.format in DIRECTORY_FORMATS:
        for line in export_directory(run.records, run.run_id, args.format, args.output):
            print(line, file=sys.stderr)
        return EXIT_OK
    text = export_records(run.records, args.format, run_id=run.run_id, environment=run.environment,
                          state=run.state.label())
    if args.format != "json" and not run.state.complete and not run.state.damaged:  # json carries it as "state"
        print(f"kvbench export: note: run {run.run_id} is {run.state.label()}", file=sys.stderr)
    if args.output:
        _write_output(args.output, text, "export")
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return EXIT_OK


def cmd_report(args) -> int:
    # lazy for startup time: the report imports numpy, scipy and matplotlib (every kvbench command pays its imports)
    from pytest_kvbench.results.report.html_report import write_report

    runs = [_load(args, r) for r in args.runs]
    target = write_report(runs, args.output, title=args.title)
    print(f"wrote {target}")
    return EXIT_OK


def cmd_merge(args) -> int:
    out = args.into or args.results  # checked writable by check_output_paths
    run_id = merge_runs(args.runs, out, results_dir=args.results)
    merged = load_run(run_id, out)
    for source in (load_run(spec, args.results) for spec in args.runs):
        print(f"run {source.run_id} is {source.state.label()}")
    print(f"merged {len(args.runs)} runs ({len(merged.records)} items) into {run_id} ({merged.path}): "
          f"{merged.state.label()}")
    return EXIT_OK


def cmd_variance(args) -> int:
    # lazy for startup time: numpy and scipy (every kvbench command pays its imports)
    from pytest_kvbench.comparison.seed_variance import HEADERS, parse_fraction, variance_groups, variance_rows
    from pytest_kvbench.stats import variation_curve

    threshold = parse_fraction(args.threshold)
    runs = [_load(args, r) for r in args.runs]
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


# -- parser -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--results", default=argparse.SUPPRESS, metavar="DIR",
                        help=f"results directory holding runs/ (default: {DEFAULT_RESULTS})")
    parser = _Parser(prog="kvbench", parents=[common],
                     description="Work with pytest-kvbench run directories (results/runs/<run_id>/). "
                                 "RUN is a run id, a unique prefix of one (with or without 'bench_'), "
                                 "'latest', or a run directory.",
                     epilog="Exit codes: 0 success, 1 regression (compare), 2 bad input or a damaged run.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("list", parents=[common], help="list runs: id, date, models, methods, budgets, tasks, commit")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("tasks", parents=[common], help="list every task: suite, metric, generation length, data source")
    p.add_argument("--suite", help="only this suite's tasks")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_tasks)
    model_listing.add_parser(sub, common)
    cli_clean.add_parser(sub, common)

    p = sub.add_parser("show", parents=[common], help="tables and environment of a run")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--reproduce", action="store_true", help="print only the commit and exact command that made the run")
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("env", parents=[common],
                       help="what reproduces a run: package versions (a pip constraints file), models, command, commit")
    p.add_argument("run", metavar="RUN")
    p.set_defaults(func=cmd_env)

    p = sub.add_parser("compare", parents=[common], help="gate run B against run (or baseline file) A; exit 1 on regression",
                       description="Same statistics and verdicts as --kvbench-compare: an item regresses when its "
                                   "score drops by more than the tolerance and the paired bootstrap 95% interval "
                                   "over the same samples lies below zero.")
    p.add_argument("baseline", metavar="A", help="baseline: a run or a file written by --kvbench-save")
    p.add_argument("current", metavar="B", help="the run to check")
    p.add_argument("--fail", action="append", metavar="METRIC:TOL",
                   help="tolerance, repeatable or comma-separated: score:1.0, latency:20%%, kv_bytes:5%%, "
                        "peak_bytes:10%% (default score:1.0; latency and memory only when given)")
    p.add_argument("--strict", action="store_true", help="also exit 1 when an item cannot be compared (mismatch)")
    p.add_argument("--seed", type=int, default=0, help="bootstrap random seed (default 0)")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("coverage", parents=[common], help="exit 1 unless RUN's gate compared every entry of BASELINE "
                                                          "(a CI step after --kvbench-compare)")
    p.add_argument("run", metavar="RUN", help="the gated run")
    p.add_argument("baseline_file", metavar="BASELINE", help="the baseline file it was gated on (--kvbench-compare)")
    p.set_defaults(func=cmd_coverage)

    p = sub.add_parser("export", parents=[common], help="export a run's tables: md, csv, latex or json; or its "
                                                        "results in kvpress's or KVCache-Factory's layout")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--format", required=True, choices=FORMATS + DIRECTORY_FORMATS)
    p.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of standard output (kvpress, "
                                                          "kvcache-factory: the directory to write into)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("report", parents=[common], help="self-contained HTML report with plots")
    p.add_argument("runs", nargs="+", metavar="RUN")
    p.add_argument("--output", "-o", default="report.html", metavar="FILE", help="HTML file (default report.html)")
    p.add_argument("--title", help="page title")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("merge", parents=[common], help="combine runs made on several machines into one new run")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories or ids (at least two)")
    p.add_argument("--into", metavar="DIR", help="results directory for the merged run (default: --results)")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("variance", parents=[common],
                       help="coefficient of variation against the number of seeds, and the seeds needed")
    p.add_argument("runs", nargs="+", metavar="RUN")
    p.add_argument("--threshold", default="1%", help="target CV of the mean score (default 1%%)")
    p.add_argument("--plot", default="variance.png", metavar="FILE",
                   help="plot file, .png/.svg/.pdf (default variance.png; 'none' for no plot)")
    p.set_defaults(func=cmd_variance)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    args.results = getattr(args, "results", DEFAULT_RESULTS)
    args.damaged = []
    try:
        check_no_blank_arguments(args)
        check_results_dir(args.results)
        check_output_paths(args)
        code = args.func(args)
        for run in args.damaged:
            print(f"kvbench {args.command}: error: run {run.run_id} is {run.state.label()}", file=sys.stderr)
        return EXIT_USAGE if args.damaged else code
    except (RunError, BaselineError, ExportError, ReportError, UsageError, VarianceError) as exc:
        print(f"kvbench {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `kvbench list | head`
        sys.stderr.close()
        return EXIT_OK
    except OSError as exc:  # a path the OS refuses that no check above foresaw: still one line
        where = f" {user_paths.shown(exc.filename)}" if exc.filename else ""
        print(f"kvbench {args.command}: error:{where} {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
