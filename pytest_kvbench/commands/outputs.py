"""The ``kvbench`` verbs that write a run out: ``export`` (tables, or another project's layout) and ``report``
(HTML)."""

from __future__ import annotations

import sys

from pytest_kvbench.commands.common import EXIT_OK, load, write_output
from pytest_kvbench.commands.query import export_parquet
from pytest_kvbench.results.exports.directory import DIRECTORY_FORMATS
from pytest_kvbench.results.exports.formats import export_directory
from pytest_kvbench.results.views.table_formats import export_records


PARQUET = "parquet"  # the query tables (commands/query.py, docs/query.md)


def cmd_export(args) -> int:
    if args.format == PARQUET:
        for line in export_parquet(args):
            print(line, file=sys.stderr)
        return EXIT_OK
    run = load(args, args.run)
    if args.format in DIRECTORY_FORMATS:
        for line in export_directory(run.records, run.run_id, args.format, args.output):
            print(line, file=sys.stderr)
        return EXIT_OK
    text = export_records(run.records, args.format, run_id=run.run_id, environment=run.environment,
                          state=run.state.label())
    if args.format != "json" and not run.state.complete and not run.state.damaged:  # json carries it as "state"
        print(f"kvbench export: note: run {run.run_id} is {run.state.label()}", file=sys.stderr)
    if args.output:
        write_output(args.output, text, "export")
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return EXIT_OK


def cmd_report(args) -> int:
    # lazy for startup time: the report imports numpy, scipy and matplotlib (every kvbench command pays its imports)
    from pytest_kvbench.results.report.html_report import write_report

    runs = [load(args, r) for r in args.runs]
    target = write_report(runs, args.output, title=args.title)
    print(f"wrote {target}")
    return EXIT_OK
