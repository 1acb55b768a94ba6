"""Native methods beside kvpress's presses run through the adapter on the same items: the table of
scripts/measure/compare_kvpress.py's `scores` comparison (docs/real-model.md).

Each native method is paired with the press that implements it, at the press's own defaults (so a row may
differ by a default window or kernel, which the docs explain); both sides score the same samples, so the
difference is paired: its 95% bootstrap interval over samples says whether the two rows differ beyond noise.
Rows are flagged when the difference exceeds the larger of the two rows' own 95% half-widths ("more than one CI").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvmethods.core.capabilities import Capability
from kvmethods.core.catalog import BUILTINS, kvpress_spec
from kvmethods.spec import MethodSpec
from tabulate import tabulate

from pytest_kvbench.results.record import Record, budget_sort_key
from pytest_kvbench.stats import bootstrap_mean, paired_bootstrap

# our method -> the adapter's spec of the kvpress press doing the same, each at its own defaults (catalog rows); not
# those deciding per layer what to keep (simlayerkv): their press takes no budget, so the adapter cannot run it
NATIVE_PRESSES = {name: spec for name in sorted(BUILTINS) if (spec := kvpress_spec(name))
                  and Capability.KEEPS_LAYERS_WHOLE not in BUILTINS[name].capabilities}


@dataclass(frozen=True)
class Side:
    """One row's per-sample scores (x 100) by sample id."""

    scores: dict[str, float]

    @property
    def mean(self) -> float:
        return sum(self.scores.values()) / len(self.scores)

    @property
    def half_width(self) -> float:
        _, low, high = bootstrap_mean(list(self.scores.values()), n_resamples=2_000)
        return (high - low) / 2 if math.isfinite(low) else math.nan


def sides(records: list[Record]) -> dict[tuple[str, str], Side]:
    """(method name, budget spec) -> per-sample scores, from a run's scored records."""
    out = {}
    for record in records:
        if record.samples and record.score is not None:
            out[(record.method.name, record.labels.budget)] = Side(
                {s["id"]: 100 * float(s["score"]) for s in record.samples})
    return out


def press_name(spec: str) -> str:
    """The adapter's method name of a spec (`kvpress:CriticalKVPress:press=SnapKVPress` -> its name)."""
    return MethodSpec.parse(spec).name


def score_rows(ours: list[Record], theirs: list[Record]) -> list[list[str]]:
    """Method, budget, native mean ± half-width, kvpress mean ± half-width (over the samples both ran), paired
    difference [95% interval], and a flag when the difference exceeds the larger half-width."""
    native, pressed = sides(ours), sides(theirs)
    rows = []
    for (method, budget), mine in sorted(native.items(), key=lambda kv: (kv[0][0], budget_sort_key(kv[0][1]))):
        spec = NATIVE_PRESSES.get(method)
        other = pressed.get((press_name(spec), budget)) if spec else None
        if other is None:
            continue
        common = sorted(set(mine.scores) & set(other.scores))  # a run of fewer samples: its first ones
        mine, other = (Side({i: side.scores[i] for i in common}) for side in (mine, other))
        diff, low, high = paired_bootstrap([mine.scores[i] for i in common], [other.scores[i] for i in common],
                                           n_resamples=2_000)
        widest = max(mine.half_width, other.half_width)
        flag = "yes" if abs(diff) > (widest if math.isfinite(widest) else 0) else ""
        rows.append([method, spec, budget, f"{mine.mean:.1f} ± {mine.half_width:.1f}",
                     f"{other.mean:.1f} ± {other.half_width:.1f}", f"{diff:+.1f} [{low:+.1f}, {high:+.1f}]", flag])
    return rows


def score_table(ours: list[dict], theirs: list[dict]) -> str:
    headers = ["method", "kvpress press", "budget", "native", "kvpress", "kvpress - native [95%]", "> 1 CI"]
    return tabulate(score_rows(ours, theirs), headers=headers, tablefmt="github", disable_numparse=True)
