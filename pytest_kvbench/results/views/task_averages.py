"""One compact table per model: each method x budget as its score averaged over the tasks, ± a 95% interval.

A run over several tasks prints one Method x Task table per budget, and a reader comparing methods wants one
number per method and budget (the README of a real-model job quotes these). The average weights every task
equally, as the per-budget tables' Avg column does, and its interval is a stratified bootstrap over samples
(`stats.stratified_bootstrap_mean`): each task's samples are resampled within that task, since the tasks are
fixed and only their samples could have been others. A row is averaged only where it has every task of the
model's tables; a model whose tables hold one task gets no compact table (its Avg is that task's cell). A run at
several context lengths gets one compact table per length (score_tables splits them), its heading naming it.
"""

from __future__ import annotations

import math

from tabulate import tabulate

from pytest_kvbench.record_key import DEFAULT_PROTOCOL
from pytest_kvbench.results.record import Record
from pytest_kvbench.results.views.table_model import AVG, TABLE_RESAMPLES, ScoreTable, score_tables


def task_average(table: ScoreTable, method: str) -> tuple[float, float | None] | None:
    """(mean over tasks x 100, half-width of its 95% stratified interval or None) of one row; None when the row
    lacks a task or a cell has no sample scores (records without per-sample rows)."""
    groups = [table.cells[(method, t)].sample_scores for t in table.tasks if (method, t) in table.cells]
    if len(groups) != len(table.tasks) or not all(groups):
        return None
    from pytest_kvbench.stats import stratified_bootstrap_mean  # lazy for startup time: scipy

    mean, low, high = stratified_bootstrap_mean(groups, n_resamples=TABLE_RESAMPLES)
    return mean, ((high - low) / 2 if math.isfinite(low) and math.isfinite(high) else None)


def _cell(average: tuple[float, float | None] | None) -> str:
    if average is None:
        return "-"
    mean, half_width = average
    return f"{mean:.1f}" + (f" ± {half_width:.1f}" if half_width is not None else "")


def task_average_tables(records: list[Record], fmt: str = "github") -> list[tuple[str, str]]:
    """[(heading, table)] per model, protocol (and context length) whose tables hold two tasks or more: Method x
    budget."""
    by_model: dict[tuple[str, str, int | None], list[ScoreTable]] = {}
    for table in score_tables(records):
        if len(table.tasks) >= 2:
            by_model.setdefault((table.model, table.protocol, table.context_length), []).append(table)
    out = []
    for (model, protocol, length), tables in by_model.items():
        methods = list(dict.fromkeys(m for t in tables for m in t.methods))
        rows = [[method, *(_cell(task_average(t, method)) if method in t.methods else "-" for t in tables)]
                for method in methods]
        tasks = list(dict.fromkeys(task for t in tables for task in t.tasks))
        heading = f"{model} — {AVG} over {len(tasks)} tasks" + (f" at {length:,} tokens" if length else "") + (
            f" — protocol {protocol}" if protocol != DEFAULT_PROTOCOL else "")
        out.append((heading, tabulate(rows, headers=["Method", *(t.budget for t in tables)], tablefmt=fmt,
                                      disable_numparse=True)))
    return out
