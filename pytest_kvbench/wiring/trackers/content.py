"""What every tracker (MLflow, W&B) receives of a run, whichever tracker it is: the grid as parameters, the
provenance as tags, each finished item's figures as metrics named by the item, the status the run ended with,
and at the end its files and the items table.

Written once here, so the trackers show the same content and differ only in how they send it (docs/trackers.md).
"""

from __future__ import annotations

import json
import re

import pytest

from pytest_kvbench.results.record import Record
from pytest_kvbench.results.query.rows import item_row

PARAM_LIMIT = 6000  # MLflow's longest parameter value
# the item's figures a tracker plots (names as the items view has them, docs/query.md)
ITEM_METRICS = ("score", "score_low", "score_high", "kl", "agreement", "decode_kl", "prefill_ms",
                "decode_tokens_per_s", "total_s", "kv_bytes_before", "kv_bytes_after", "peak_bytes")
FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"  # MLflow's run statuses; W&B keeps them in its summary
_NOT_A_NAME = re.compile(r"[^\w.\- /]")  # MLflow metric names: letters, digits, _ . - space /


def _value(value: object) -> str:
    if isinstance(value, dict) and "name" in value:  # a method: its spec, snapkv:window=64
        return str(value["name"]) + "".join(f":{k}={v}" for k, v in sorted((value.get("params") or {}).items()))
    if isinstance(value, (list, tuple)):
        return ",".join(_value(v) for v in value)
    return value if isinstance(value, str) else json.dumps(value)


def grid_params(grid: dict) -> dict[str, str]:
    """The grid (``Grid.as_dict()``, settings.json) as flat text parameters: lists comma-joined, methods as specs."""
    return {name: _value(value)[:PARAM_LIMIT] for name, value in grid.items() if value not in (None, [], "")}


def run_tags(run_id: str, environment: dict) -> dict[str, str]:
    """The kvbench run id (how a resumed run finds its tracker run again), commit and command."""
    tags = {"kvbench.run_id": run_id, "kvbench.commit": environment.get("git_commit"),
            "kvbench.dirty": environment.get("git_dirty"), "kvbench.command": environment.get("command")}
    return {name: str(value)[:PARAM_LIMIT] for name, value in tags.items() if value is not None}


def item_name(record: Record) -> str:
    """The item's name in a tracker: its pytest id (``snapkv-128-qasper``), characters trackers refuse as ``_``."""
    return _NOT_A_NAME.sub("_", record.item_id or record.key)


def item_metrics(record: Record, run_id: str) -> dict[str, float]:
    """``<item>/<metric>`` -> value for every figure the record holds (none for a skipped or errored item but
    its status); the score interval is the items view's (a bootstrap over the item's samples)."""
    row = item_row(record, run_id)
    name = item_name(record)
    return {f"{name}/{metric}": float(row[metric]) for metric in ITEM_METRICS if row[metric] is not None}


def items_table(records: list[Record], run_id: str) -> tuple[list[str], list[list]]:
    """The items view of the run (docs/query.md): columns and rows, for a tracker's table."""
    rows = [item_row(record, run_id) for record in records]
    columns = list(rows[0]) if rows else []
    return columns, [[row[c] for c in columns] for row in rows]


def run_status(exitstatus: int, unfinished: list, write_failures: list) -> str:
    """KILLED for an interrupted run, FAILED when items did not finish (a crashed worker, a refused write) or the
    run's files could not all be written or pytest itself failed, else FINISHED (failed items and regressions
    included: the benchmark ran to its end)."""
    if exitstatus == pytest.ExitCode.INTERRUPTED:
        return KILLED
    if unfinished or write_failures or exitstatus in (pytest.ExitCode.INTERNAL_ERROR, pytest.ExitCode.USAGE_ERROR):
        return FAILED
    return FINISHED
