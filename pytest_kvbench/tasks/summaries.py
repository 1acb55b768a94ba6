"""Per-suite summary tables, as each suite's paper prints its results.

Table code (RESULTS.md, LaTeX export) groups a run's records by model and budget and hands each
group here as ``{method: {task label: [records]}}``; this module decides what a suite adds and
returns plain numbers, which the table code only formats:

* LongBench v2: Overall, Easy, Hard, Short, Medium, Long (result.py's columns, from each
  record's ``aggregate["splits"]``), one table for ``longbench_v2`` and one for the CoT variant.
* InfiniteBench: the tasks under the paper's names (Retrieve.PassKey, En.Sum, ...) in the
  paper's order, and their average.

Several seeds of one cell are averaged. Suites without a summary add nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean

from .infinitebench.specs import PAPER_NAMES
from .longbench_v2.task import DIFFICULTIES, LENGTHS

Cells = dict[str, dict[str, list[dict]]]


@dataclass
class Summary:
    title: str
    columns: list[str]
    values: dict[str, dict[str, float | None]]  # method -> column -> value (None: not run)


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return fmean(values) if values else None


def _records_of(cells: Cells, method: str, task: str) -> list[dict]:
    return [r for label, records in cells[method].items() if label.split("@")[0] == task for r in records]


def longbench_v2_summaries(cells: Cells) -> list[Summary]:
    columns = ["overall", *DIFFICULTIES, *LENGTHS]
    tasks = sorted({r["task"]["name"] for by_task in cells.values() for records in by_task.values()
                    for r in records if r["task"].get("suite") == "longbench_v2"})
    summaries = []
    for task in tasks:
        values = {}
        for method in cells:
            records = _records_of(cells, method, task)
            if records:
                values[method] = {column: _mean((r.get("aggregate") or {}).get("splits", {}).get(column)
                                                for r in records) for column in columns}
        summaries.append(Summary(f"LongBench v2 ({task})", [c.capitalize() for c in columns],
                                 {m: {c.capitalize(): v[c] for c in columns} for m, v in values.items()}))
    return summaries


def infinitebench_summary(cells: Cells) -> list[Summary]:
    present = [task for task in PAPER_NAMES
               if any(_records_of(cells, method, task) for method in cells)]
    if not present:
        return []
    values = {}
    for method in cells:
        scores = {PAPER_NAMES[task]: _mean(r["score"] for r in _records_of(cells, method, task)) for task in present}
        complete = all(v is not None for v in scores.values())
        values[method] = scores | {"Avg": fmean(scores.values()) if complete else None}
    return [Summary("InfiniteBench", [PAPER_NAMES[t] for t in present] + ["Avg"], values)]


def turn_summary(cells: Cells) -> list[Summary]:
    """Score by turn of the multi_turn protocol (SCBench's per-turn view): per method, the mean over its
    records of each turn's score (aggregate "turns", engine/protocol_runs.py)."""
    by_method: dict[str, dict[str, list[float]]] = {}
    for method, by_task in cells.items():
        for records in by_task.values():
            for r in records:
                if r.get("protocol") != "multi_turn":
                    continue
                for turn, score in ((r.get("aggregate") or {}).get("turns") or {}).items():
                    by_method.setdefault(method, {}).setdefault(f"Turn {turn}", []).append(score)
    columns = sorted({c for turns in by_method.values() for c in turns}, key=lambda c: int(c.split()[-1]))
    if not columns:
        return []
    values = {m: {c: _mean(turns.get(c, [])) for c in columns} for m, turns in by_method.items()}
    return [Summary("score by turn", columns, values)]


def suite_summaries(cells: Cells) -> list[Summary]:
    """Every suite summary for one (model, budget) group of records, and the score by turn."""
    return longbench_v2_summaries(cells) + infinitebench_summary(cells) + turn_summary(cells)
