"""Per-suite summary tables, as each suite's paper prints its results.

Table code (RESULTS.md, LaTeX export) groups a run's records by model and budget and hands each
group here as ``{method: {task label: [records]}}``; this module decides what a suite adds and
returns plain numbers, which the table code only formats:

* LongBench v2: Overall, Easy, Hard, Short, Medium, Long (result.py's columns, from each
  record's ``aggregate["splits"]``), one table for ``longbench_v2`` and one for the CoT variant.
* InfiniteBench: the tasks under the paper's names (Retrieve.PassKey, En.Sum, ...) in the
  paper's order, and their average.
* SCBench: per task, the score of each turn (compute_scores.py reports accuracy per turn), then the
  pooled score of all turns (the task's figure in the main table), labelled "Pooled".
* Other multi_turn tasks (RULER with questions): the score by turn over all of them.

Several seeds of one cell are averaged. Suites without a summary add nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import fmean
from typing import TYPE_CHECKING

from pytest_kvbench.results.record import mean_of_present
from pytest_kvbench.tasks.infinitebench.specs import PAPER_NAMES
from pytest_kvbench.tasks.longbench_v2.task import DIFFICULTIES, LENGTHS

if TYPE_CHECKING:  # tasks sit below results: the record type only, for the annotations
    from pytest_kvbench.results.record import Record

Cells = dict[str, dict[str, list["Record"]]]


@dataclass
class Summary:
    title: str
    columns: list[str]
    values: dict[str, dict[str, float | None]]  # method -> column -> value (None: not run)
    by_turn: bool = False  # a score-by-turn table (the HTML report shows these under the score table)


def _records_of(cells: Cells, method: str, task: str) -> list[Record]:
    return [r for label, records in cells[method].items() if label.split("@")[0] == task for r in records]


def _suite_tasks(cells: Cells, suite: str) -> list[str]:
    return sorted({r.task.name for by_task in cells.values() for records in by_task.values()
                   for r in records if r.task.suite == suite})


def _turn_columns(turns: dict[str, list[float]]) -> list[str]:
    return sorted(turns, key=lambda column: int(column.split()[-1]))


def _scores_by_turn(records: list[Record]) -> dict[str, list[float]]:
    """{"Turn k": [each record's score of turn k]} from the records' aggregate "turns"."""
    by_turn: dict[str, list[float]] = {}
    for r in records:
        for turn, score in (r.aggregate.get("turns") or {}).items():
            by_turn.setdefault(f"Turn {turn}", []).append(score)
    return by_turn


def longbench_v2_summaries(cells: Cells) -> list[Summary]:
    columns = ["overall", *DIFFICULTIES, *LENGTHS]
    summaries = []
    for task in _suite_tasks(cells, "longbench_v2"):
        values = {}
        for method in cells:
            records = _records_of(cells, method, task)
            if records:
                values[method] = {column: mean_of_present(r.aggregate.get("splits", {}).get(column)
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
        scores = {PAPER_NAMES[task]: mean_of_present(r.score for r in _records_of(cells, method, task)) for task in present}
        complete = all(v is not None for v in scores.values())
        values[method] = scores | {"Avg": fmean(scores.values()) if complete else None}
    return [Summary("InfiniteBench", [PAPER_NAMES[t] for t in present] + ["Avg"], values)]


def scbench_summaries(cells: Cells) -> list[Summary]:
    """Per SCBench task and method: each turn's score (several seeds averaged), then the pooled score."""
    summaries = []
    for task in _suite_tasks(cells, "scbench"):
        by_method = {method: _records_of(cells, method, task) for method in cells}
        by_method = {method: records for method, records in by_method.items() if records}
        turns = {method: _scores_by_turn(records) for method, records in by_method.items()}
        columns = _turn_columns({column: [] for by_turn in turns.values() for column in by_turn})
        values = {method: {c: mean_of_present(turns[method].get(c, [])) for c in columns}
                  | {"Pooled": mean_of_present(r.score for r in records)} for method, records in by_method.items()}
        histories = sorted({r.task.history or "model" for records in by_method.values() for r in records})
        summaries.append(Summary(f"SCBench {task} by turn ({', '.join(histories)} history)", columns + ["Pooled"],
                                 values, by_turn=True))
    return summaries


def turn_summary(cells: Cells) -> list[Summary]:
    """Score by turn of the multi_turn protocol for tasks other than SCBench's (which have their own): per
    method, the mean over its records of each turn's score (aggregate "turns", engine/protocol_runs.py)."""
    by_method = {}
    for method, by_task in cells.items():
        records = [r for records in by_task.values() for r in records
                   if r.protocol == "multi_turn" and r.task.suite != "scbench"]
        turns = _scores_by_turn(records)
        if turns:
            by_method[method] = turns
    columns = _turn_columns({column: [] for turns in by_method.values() for column in turns})
    if not columns:
        return []
    values = {m: {c: mean_of_present(turns.get(c, [])) for c in columns} for m, turns in by_method.items()}
    return [Summary("score by turn", columns, values, by_turn=True)]


def suite_summaries(cells: Cells) -> list[Summary]:
    """Every suite summary for one (model, budget) group of records, and the score by turn."""
    return longbench_v2_summaries(cells) + infinitebench_summary(cells) + scbench_summaries(cells) + turn_summary(cells)
