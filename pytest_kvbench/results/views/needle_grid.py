"""Needle-in-a-haystack grids: retrieval score by needle depth and context length.

The ``niah_grid*`` tasks place one needle at several depths of several context lengths; each
sample carries its ``depth`` and ``context_length`` fields. ``needle_grids`` aggregates them
once, per (model, task, method, budget), for RESULTS.md's tables and the HTML report's heatmaps.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from statistics import fmean

from kvmethods import FULL_CACHE
from pytest_kvbench.results.record import Record, budget_sort_key, is_number

NEEDLE_FAMILY = "niah_grid"


@dataclass
class NeedleGrid:
    """Mean score (0-100) per (depth %, context length) of one model, task, method and budget."""

    model: str
    task: str
    method: str
    budget: str
    depths: list[float]
    lengths: list[int]
    scores: dict[tuple[float, int], float]

    def score(self, depth: float, length: int) -> float | None:
        return self.scores.get((depth, length))

    @property
    def title(self) -> str:
        """``model — task — method`` and ``@ budget`` for compressed rows."""
        return f"{self.model} — {self.task} — {self.method}" + ("" if self.budget == FULL_CACHE.spec else f" @ {self.budget}")


def is_needle_record(record: Record) -> bool:
    return record.task.extra.get("family") == NEEDLE_FAMILY or str(record.task.name).startswith(NEEDLE_FAMILY)


def _sample_field(sample: dict, name: str):
    fields = sample.get("fields") if isinstance(sample.get("fields"), dict) else {}
    return sample.get(name, fields.get(name))


def needle_grids(records: Iterable[Record]) -> list[NeedleGrid]:
    """Every needle grid of the records, ordered by model, task, method and budget."""
    cells: dict[tuple[str, str, str, str], dict[tuple[float, int], list[float]]] = defaultdict(lambda: defaultdict(list))
    for record in records:
        if not is_needle_record(record):
            continue
        label = record.labels
        group = (record.model_title, record.task.name, label.method, label.budget)
        for sample in record.samples:
            depth = _sample_field(sample, "depth")
            length = _sample_field(sample, "context_length") or record.task.context_length
            if is_number(depth) and is_number(length) and is_number(sample.get("score")):
                cells[group][(float(depth), int(length))].append(100.0 * float(sample["score"]))
    grids = []
    for (model, task, method, budget), grid in sorted(cells.items(), key=lambda kv: (
            kv[0][0], kv[0][1], kv[0][2], budget_sort_key(kv[0][3]))):
        grids.append(NeedleGrid(model, task, method, budget, sorted({d for d, _ in grid}), sorted({n for _, n in grid}),
                                {point: fmean(values) for point, values in grid.items()}))
    return grids
