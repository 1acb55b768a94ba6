"""The query tables in DuckDB: ``kvbench query "SQL"`` runs against them, ``kvbench export --format parquet``
writes them out.

The rows (query/rows.py) become Arrow tables with the documented types (query/columns.py), which DuckDB reads
in place as the views ``runs``, ``items`` and ``samples`` of an in-memory database: nothing in the results
directory is written. DuckDB is imported here only, and only the ``kvbench`` command imports this module
(lazily), so a pytest run never pays for it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from pytest_kvbench.results.query.columns import TABLES, schema


class QueryError(ValueError):
    """DuckDB refused the SQL; the message is DuckDB's own, in one line."""


def arrow_tables(rows: dict[str, list[dict]]) -> dict[str, pa.Table]:
    """Each table's rows as an Arrow table of its documented schema (a column a row lacks is null)."""
    return {name: pa.Table.from_pylist(rows[name], schema=schema(name)) for name in TABLES}


@dataclass
class Answer:
    columns: list[str]
    rows: list[tuple]


def one_line(error: Exception) -> str:
    """DuckDB's message without its source excerpt (``LINE 1: ...`` and the caret under it), on one line."""
    lines = [line.strip() for line in str(error).splitlines()]
    kept = [line for line in lines if line and not line.startswith("LINE ") and set(line) != {"^"}]
    return " ".join(kept) or type(error).__name__


def connect(tables: dict[str, pa.Table]) -> duckdb.DuckDBPyConnection:
    """An in-memory database with a view per table."""
    connection = duckdb.connect(":memory:")
    for name, table in tables.items():
        connection.register(name, table)
    return connection


def run_query(tables: dict[str, pa.Table], sql: str) -> Answer:
    """The answer of ``sql`` (its last statement's rows; none for a statement that returns nothing)."""
    connection = connect(tables)
    try:
        cursor = connection.execute(sql)
        if cursor.description is None:
            return Answer([], [])
        return Answer([d[0] for d in cursor.description], cursor.fetchall())
    except duckdb.Error as exc:
        raise QueryError(one_line(exc)) from None
    finally:
        connection.close()


PARQUET_FILES = {name: f"{name}.parquet" for name in TABLES}


def write_parquet(tables: dict[str, pa.Table], directory: str | os.PathLike) -> list[Path]:
    """``runs.parquet``, ``items.parquet`` and ``samples.parquet`` under ``directory`` (made if missing); each file
    written under a temporary name and renamed, so a reader never sees half of one."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    written = []
    for name, table in tables.items():
        target = root / PARQUET_FILES[name]
        partial = target.with_name(f".{target.name}.partial")
        pq.write_table(table, partial)
        os.replace(partial, target)
        written.append(target)
    return written
