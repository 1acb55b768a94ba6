"""``kvbench query "SQL"``: SQL over every run under the results directory (DuckDB), and the same tables
written as Parquet by ``kvbench export RUN --format parquet -o DIR``.

Questions across runs (a method's score on every model and commit, what loses least per byte) should not need a
script against records.jsonl: the views ``runs``, ``items`` and ``samples`` (docs/query.md) answer them. DuckDB
and pyarrow are imported only when these verbs run (the plugin never imports this module's dependencies).
"""

from __future__ import annotations

import csv
import json
import math
import sys
from datetime import date, datetime
from decimal import Decimal

from tabulate import tabulate

from pytest_kvbench.cli_checks import UsageError
from pytest_kvbench.commands.common import EXIT_OK, load


def add_parser(sub, common) -> None:
    p = sub.add_parser("query", parents=[common], help="SQL over every run: views runs, items, samples (docs/query.md)",
                       description="Run SQL (DuckDB) over the runs under the results directory. Views: runs (one "
                                   "row per run), items (one per record), samples (one per sample); docs/query.md "
                                   "lists their columns.")
    p.add_argument("sql", metavar="SQL", help='the query, e.g. "SELECT method, avg(score) FROM items GROUP BY method"')
    p.add_argument("--run", metavar="RUN", help="only this run in the views")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json", dest="output_format", action="store_const", const="json",
                       help="a JSON list of objects")
    shape.add_argument("--csv", dest="output_format", action="store_const", const="csv", help="CSV with a header")
    p.set_defaults(func=cmd_query, output_format="table")


def query_tables(args):
    """The three tables of ``--run``'s run, or of every run (a damaged ``--run`` is named at the end: exit 2)."""
    # lazy: duckdb and pyarrow, imported by the verbs that use them only (every kvbench command pays its imports)
    from pytest_kvbench.results.query.database import arrow_tables
    from pytest_kvbench.results.query.rows import read_runs, table_rows

    runs = [load(args, args.run)] if getattr(args, "run", None) else read_runs(args.results)
    return arrow_tables(table_rows(runs))


def cmd_query(args) -> int:
    # lazy: duckdb, for this verb only
    from pytest_kvbench.results.query.database import QueryError, run_query

    try:
        answer = run_query(query_tables(args), args.sql)
    except QueryError as exc:
        raise UsageError(str(exc)) from None
    write_answer(answer.columns, answer.rows, args.output_format, sys.stdout)
    return EXIT_OK


def _plain(value):
    """A value JSON and CSV can hold: times in ISO 8601, decimals as floats, NaN and infinities as null."""
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        value = float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def write_answer(columns: list[str], rows: list[tuple], output_format: str, out) -> None:
    if not columns:
        return
    if output_format == "json":
        out.write(json.dumps([dict(zip(columns, map(_plain, row))) for row in rows], indent=2, default=str) + "\n")
    elif output_format == "csv":
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows([["" if v is None else v for v in map(_plain, row)] for row in rows])
    else:
        out.write(tabulate([list(map(_plain, row)) for row in rows], headers=columns, missingval="NULL") + "\n")


def export_parquet(args) -> list[str]:
    """``kvbench export RUN --format parquet -o DIR``: the run's three tables as Parquet files."""
    # lazy: pyarrow's Parquet writer, for this format only
    from pytest_kvbench.results.query.database import arrow_tables, write_parquet
    from pytest_kvbench.results.query.rows import table_rows

    if not args.output:
        raise UsageError("--format parquet writes a directory of files: give --output DIR")
    run = load(args, args.run)

    tables = arrow_tables(table_rows([run]))
    written = write_parquet(tables, args.output)
    return [f"wrote {', '.join(p.name for p in written)} under {args.output} "
            f"({tables['items'].num_rows} items, {tables['samples'].num_rows} samples)"]
