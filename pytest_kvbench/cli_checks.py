"""``kvbench``'s arguments, checked before a command reads a run or prints anything.

A command that prints its table and then finds that its ``--plot`` or ``-o`` path cannot be
written leaves half an answer on the terminal and a script that cannot tell what happened. So
blank values, the results directory and every path a command will write (``export -o``,
``report -o``, ``variance --plot``, ``merge --into``) are checked first; each problem is a
``UsageError`` whose one line names the argument and what is wrong (exit 2).
"""

from __future__ import annotations

import argparse

from pytest_kvbench import user_paths


class UsageError(ValueError):
    """Bad command-line input that argparse cannot see (a threshold out of range, ...)."""


_POSITIONALS = {"run": "RUN", "runs": "RUN", "baseline": "A", "current": "B", "baseline_file": "BASELINE",
               "sql": "SQL",
               "gate_baselines": "--baseline"}  # dest -> what the user typed, where it is not "--" + dest


def check_no_blank_arguments(args: argparse.Namespace) -> None:
    """An empty string given to any argument (`-o ''`, `--into ''`, `--plot ''`, a run `''`) is refused before
    anything runs or prints: read as "unset" it would write or show something other than what was asked."""
    for name, value in sorted(vars(args).items()):
        for given in value if isinstance(value, list) else [value]:
            if isinstance(given, str) and not given.strip():
                shown = _POSITIONALS.get(name, "--" + name.replace("_", "-"))
                raise UsageError(f"{shown} is empty; give a value or leave it out")


def check_results_dir(path: str) -> None:
    """--results may name a directory not made yet (no runs), but never a file or an unusable path."""
    try:
        _, info = user_paths.checked(path, "--results")
        if info is not None:
            user_paths.existing_dir(path, "--results")
    except user_paths.PathError as exc:
        raise UsageError(str(exc)) from None


def _output_targets(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(option, path, "file" | "dir") of every path the command will write."""
    command = args.command
    if command == "export" and args.output:
        # lazy for startup time: the export layouts import numpy and scipy; only `export` needs them
        from pytest_kvbench.results.exports.directory import DIRECTORY_FORMATS

        return [("--output", args.output, "dir" if args.format in DIRECTORY_FORMATS + ("parquet",) else "file")]
    if command == "report":
        return [("--output", args.output, "file")]
    if command == "variance" and args.plot.lower() != "none":
        return [("--plot", args.plot, "file")]
    if command == "merge":
        return [("--into" if args.into else "--results", args.into or args.results, "dir")]
    return []


def check_output_paths(args: argparse.Namespace) -> None:
    """Every path the command will write can be written: a directory (made if missing) or a file (made or
    replaced); a plot's extension names a format matplotlib writes."""
    for option, path, kind in _output_targets(args):
        try:
            # a results directory (merge --into) is made with its parents; an output path goes into an existing folder
            if kind == "dir":
                user_paths.writable_dir(path, option, make_parents=args.command == "merge")
            else:
                user_paths.writable_file(path, option, make_parents=False)
        except user_paths.PathError as exc:
            raise UsageError(str(exc)) from None
        if option == "--plot":
            # lazy for startup time: figures imports numpy and scipy; only `variance --plot` needs it
            from pytest_kvbench.results.report.figures import ReportError, plot_format

            try:
                plot_format(path)
            except ReportError as exc:
                raise UsageError(str(exc)) from None
