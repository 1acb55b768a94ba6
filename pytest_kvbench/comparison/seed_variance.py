"""How many seeds an item needs: ``kvbench variance`` over several runs of the same grid.

A score that moves by a point between seeds cannot gate a change of half a point. For each
configuration (an item's key without its seed) this gathers the scores over all seeds of the given
runs and reports the coefficient of variation of the mean against the number of seeds
(stats.variation_curve), and how many seeds bring it under a threshold.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from pytest_kvbench.input_values import ascii_float
from pytest_kvbench.results.views.table_formats import config_key
from pytest_kvbench.results.run.directories import Run
from pytest_kvbench.stats import VariationCurve

HEADERS = ["item", "seeds", "mean", "CV per seed", "CV of the mean (seeds: CV)", "seeds needed"]


class VarianceError(ValueError):
    """A threshold that is not a positive fraction, or runs with fewer than two seeds of any item."""


def parse_fraction(text: str) -> float:
    """``1%`` or ``0.01``: a positive fraction for a coefficient-of-variation threshold."""
    raw = text.strip()
    try:
        value = ascii_float(raw[:-1]) / 100.0 if raw.endswith("%") else ascii_float(raw)  # not '١%' or '1_0'
    except ValueError:
        raise VarianceError(f"invalid threshold {text!r}: use a percentage like 1% or a fraction like 0.01") from None
    if not (0 < value < 10) or not math.isfinite(value):
        raise VarianceError(f"invalid threshold {text!r}: it must be positive")
    return value


def variance_groups(runs: Sequence[Run]) -> dict[str, list[float]]:
    """Scores of each configuration (item key without the seed) over all its seeds, in seed order."""
    groups: dict[str, list[tuple]] = defaultdict(list)
    for run in runs:
        for r in run.records:
            if r.is_scored:
                groups[config_key(r)].append((r.seed if isinstance(r.seed, int) else 0, run.run_id, float(r.score)))
    return {key: [score for *_, score in sorted(values)] for key, values in sorted(groups.items())}


def _fmt(value) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) and math.isfinite(value) else "-"


def variance_rows(curves: Sequence[tuple[str, VariationCurve]]) -> list[list]:
    """One table row per configuration (HEADERS); a usage error when no item has two seeds."""
    if not any(curve.n >= 2 for _, curve in curves):
        raise VarianceError("variance needs at least two seeds of one item (run with --kvbench-seeds 0,1,2)")
    rows = []
    for key, curve in curves:
        if curve.n < 2:
            rows.append([key, curve.n, _fmt(curve.mean), "-", "-", "run more seeds"])
            continue
        by_k = ", ".join(f"{k}: {100 * m:.2f}%" for k, _, m in curve.points)
        if curve.needed is None:
            needed = "-"
        elif curve.enough:
            needed = f"{curve.needed} (enough)"
        else:
            needed = f"{curve.needed} (run {curve.needed - curve.n} more)"
        rows.append([key, curve.n, _fmt(curve.mean), f"{100 * curve.cv:.2f}%", by_k, needed])
    return rows
