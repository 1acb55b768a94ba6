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
import sys
from collections.abc import Sequence

from pytest_kvbench import model_listing, user_paths
from pytest_kvbench.commands import clean, methods, query
from pytest_kvbench.cli_checks import (UsageError, check_no_blank_arguments, check_output_paths,
                                      check_results_dir)
from pytest_kvbench.commands.common import EXIT_OK, EXIT_REGRESSION, EXIT_USAGE
from pytest_kvbench.commands.gates import cmd_compare, cmd_coverage, cmd_variance
from pytest_kvbench.commands.outputs import PARQUET, cmd_export, cmd_report
from pytest_kvbench.commands.runs import cmd_env, cmd_list, cmd_merge, cmd_show, cmd_tasks
from pytest_kvbench.comparison.baseline_file import BaselineError
from pytest_kvbench.comparison.seed_variance import VarianceError
from pytest_kvbench.results.exports.directory import DIRECTORY_FORMATS
from pytest_kvbench.results.report.html_report import ReportError
from pytest_kvbench.results.run.directories import RunError
from pytest_kvbench.results.views.table_formats import FORMATS, ExportError

__all__ = ["EXIT_OK", "EXIT_REGRESSION", "EXIT_USAGE", "build_parser", "main"]  # the verbs: commands/

DEFAULT_RESULTS = "results"


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (and exit code 2) instead of usage + error."""

    def error(self, message: str):
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


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
    methods.add_parser(sub, common)
    clean.add_parser(sub, common)
    query.add_parser(sub, common)

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

    p = sub.add_parser("coverage", parents=[common],
                       help="what the gates cover: method x budget kind x protocol from the gates' baseline files, "
                            "exit 1 when a built-in method, budget kind or protocol has no entry that can fail; "
                            "with RUN BASELINE: exit 1 unless RUN's gate compared every entry of BASELINE "
                            "(a CI step after --kvbench-compare)")
    p.add_argument("run", metavar="RUN", nargs="?", help="the gated run (with BASELINE)")
    p.add_argument("baseline_file", metavar="BASELINE", nargs="?",
                   help="the baseline file it was gated on (--kvbench-compare)")
    p.add_argument("--baseline", action="append", metavar="FILE", dest="gate_baselines",
                   help="a gate's baseline file, repeatable (default: every baseline*.json in the results directory)")
    p.add_argument("--json", action="store_true", help="machine-readable matrix")
    p.set_defaults(func=cmd_coverage)

    p = sub.add_parser("export", parents=[common], help="export a run's tables: md, csv, latex or json; its "
                                                        "results in kvpress's or KVCache-Factory's layout; or its "
                                                        "query tables as Parquet files")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--format", required=True, choices=FORMATS + DIRECTORY_FORMATS + (PARQUET,))
    p.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of standard output (kvpress, "
                                                          "kvcache-factory, parquet: the directory to write into)")
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
