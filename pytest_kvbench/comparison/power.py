"""What each gate entry can detect: the smallest score drop the gate fails at its sample count, whether its
fidelity figures can fail it, and which entries cannot fail at all.

A gate whose entries cannot fail passes whatever the code does (issue 37: 46 of the 48 smoke entries scored 0
on every sample and the gate only looked for drops). So `kvbench compare` and the terminal summary show each
entry's power and warn, in one line, about the entries that only an error can fail.

The smallest detectable drop is found with the gate's own statistics: the entry's best samples are lost one by
one (their per-sample score set to 0, the drop a broken method shows) until the paired bootstrap puts the whole
interval below zero beyond the score tolerance. Fidelity can fail an entry when it has at least two samples
with figures, is not the full cache itself (KL 0 and agreement 1 by definition), and moved away from the full
cache on some sample (else the compressed output was the full cache's on every sample: nothing to see move).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tabulate import tabulate

from pytest_kvbench.comparison.tolerances import FIDELITY_METRICS, Tolerances
from pytest_kvbench.comparison.verdicts import SCORE_SCALE
from pytest_kvbench.results.record import is_number
from pytest_kvbench.stats import compare_paired

POWER_RESAMPLES = 2_000  # enough to place the interval's edge; the verdicts themselves use 10,000
NO_SIGNAL_KL = 1e-6  # below this on every sample (and agreement 1), the output was the full cache's


@dataclass(frozen=True)
class Power:
    """One baseline entry's power: the smallest score drop (points) the gate fails, and fidelity's part."""

    key: str
    n: int
    score_drop: float | None  # None: no drop can fail it (scores 0 everywhere, one sample, score not gated)
    score_why: str
    fidelity: tuple[str, ...]  # the gated fidelity metrics that can fail it
    fidelity_why: str

    @property
    def can_fail(self) -> bool:
        return self.score_drop is not None or bool(self.fidelity)


def smallest_drop(scores: list[float], allowed: float, seed: int = 0) -> float | None:
    """The smallest mean drop (points) the gate fails when the best samples lose their score, one at a time;
    None when even losing every answer is not detected."""
    points = sorted((SCORE_SCALE * s for s in scores), reverse=True)
    lost = [p for p in points if p > 0]

    def fails(k: int) -> bool:
        after = [0.0] * k + points[k:]
        result = compare_paired(points, after, n_resamples=POWER_RESAMPLES, seed=seed)
        return result.mean_diff < -allowed and result.significant_drop

    low, high = 1, len(lost)
    if not lost or not fails(high):
        return None
    while low < high:  # losing more answers never makes the drop harder to see
        middle = (low + high) // 2
        if fails(middle):
            high = middle
        else:
            low = middle + 1
    return sum(lost[:low]) / len(points)


def entry_power(entry, tolerances: Tolerances, seed: int = 0) -> Power:
    """The power of one BaselineEntry under these tolerances."""
    samples = entry.samples
    n = len(samples)
    scores = [s["score"] for s in samples if is_number(s.get("score"))]
    score_tolerance = tolerances.get("score")
    drop, score_why = None, ""
    if score_tolerance is None:
        score_why = "score not gated"
    elif n < 2:
        score_why = "one sample"
    elif not any(scores):
        score_why = "scores 0 on every sample"
    else:
        drop = smallest_drop(scores, score_tolerance.allowed(entry.score), seed)
        score_why = "" if drop is not None else "no drop is significant"
    gated = [m for m in FIDELITY_METRICS if m in tolerances]
    figures = {m: [s[m] for s in samples if is_number(s.get(m))] for m in gated}
    fidelity: tuple[str, ...] = ()
    if not gated:
        fidelity_why = "fidelity not gated"
    elif entry.budget is not None and entry.budget.kind == "none":
        fidelity_why = "the full cache itself"
    elif not any(len(values) >= 2 for values in figures.values()):
        fidelity_why = "no fidelity figures" if not any(figures.values()) else "one sample"
    elif all(v <= NO_SIGNAL_KL for v in figures.get("kl", []) + figures.get("decode_kl", [])) and \
            all(v == 1.0 for v in figures.get("agreement", [])):
        fidelity_why = "output equal to the full cache's on every sample"
    else:
        fidelity = tuple(m for m in gated if len(figures[m]) >= 2)
        fidelity_why = ""
    return Power(entry.key, n, drop, score_why, fidelity, fidelity_why)


def gate_powers(entries: Iterable, tolerances: Tolerances, seed: int = 0) -> list[Power]:
    return [entry_power(entry, tolerances, seed) for entry in sorted(entries, key=lambda e: e.key)]


def power_table(powers: list[Power], tablefmt: str = "simple") -> str:
    """One row per gate entry: samples, the smallest score drop it detects, the fidelity metrics that gate it."""
    rows = []
    for power in powers:
        drop = f"{power.score_drop:.1f} points" if power.score_drop is not None else f"- ({power.score_why})"
        fidelity = ", ".join(power.fidelity) if power.fidelity else f"- ({power.fidelity_why})"
        rows.append([power.key, power.n, drop, fidelity])
    return tabulate(rows, headers=["gate entry", "n", "smallest score drop detected", "fidelity gated"],
                    tablefmt=tablefmt, disable_numparse=True)


def cannot_fail_warning(powers: list[Power]) -> str | None:
    """One line naming the entries that neither a score drop nor a fidelity change can fail (only an error)."""
    dead = [p for p in powers if not p.can_fail]
    if not dead:
        return None
    shown = ", ".join(f"{p.key} ({p.score_why}; {p.fidelity_why})" for p in dead[:6])
    more = f", ... ({len(dead) - 6} more)" if len(dead) > 6 else ""
    return (f"warning: {len(dead)} of {len(powers)} gate entries cannot fail on score or fidelity (only an error "
            f"fails them): {shown}{more}")


def power_lines(entries: Iterable, tolerances: Tolerances, seed: int = 0) -> list[str]:
    """What the gate's reports (``kvbench compare``, the terminal summary) say of its power: a heading, the
    table and, when some entry cannot fail, the warning."""
    powers = gate_powers(entries, tolerances, seed)
    warning = cannot_fail_warning(powers)
    return ["gate power (what each baseline entry can detect):", power_table(powers), *([warning] if warning else [])]
