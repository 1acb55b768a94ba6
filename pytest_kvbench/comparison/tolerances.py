"""Tolerances of the regression gate: how much each gated metric may move (``--kvbench-compare-fail``).

``score:1.0`` allows a drop of one point, ``latency:20%`` a 20% slowdown, ``score:off`` stops
gating the score; ``score:1.0:two-sided`` also fails a significant rise. The score and the
fidelity figures (``kl``, ``agreement``, ``decode_kl``: per-sample distance to the full cache) are
gated unless switched off, latency and memory only when named. Fidelity is two-sided by default:
a method whose distance to the full cache moves significantly either way has changed, and an
intended change is recorded with ``--kvbench-save``. The default fidelity tolerances are
calibrated against measured noise (docs/baselines.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pytest_kvbench.comparison.baseline_file import BaselineError
from pytest_kvbench.input_values import InputError, ascii_float, shown, split_list


@dataclass(frozen=True)
class GatedMetric:
    """A metric the gate knows: which direction is worse, and whether a move either way fails by default."""

    name: str
    higher_is_better: bool
    unit: str
    help: str
    two_sided: bool = False
    span: float | None = None  # the metric lies in [0, span]: an absolute tolerance above it can never fail


METRICS = {
    "score": GatedMetric("score", True, "points", "task score (0-100); absolute points or % of the baseline",
                          span=100.0),
    "latency": GatedMetric("latency", False, "s", "item latency; seconds or % of the baseline"),
    "kv_bytes": GatedMetric("kv_bytes", False, "bytes", "KV cache kept after compression; bytes or %"),
    "peak_bytes": GatedMetric("peak_bytes", False, "bytes", "peak accelerator/process memory; bytes or %"),
    "kl": GatedMetric("kl", False, "nats", "teacher-forced KL to the full cache; nats or %", two_sided=True),
    "agreement": GatedMetric("agreement", True, "", "greedy agreement with the full cache (0-1); absolute or %",
                             two_sided=True, span=1.0),
    "decode_kl": GatedMetric("decode_kl", False, "nats", "KL of the greedy decode to the full cache; nats or %",
                             two_sided=True),
}
FIDELITY_METRICS = ("kl", "agreement", "decode_kl")
_ALIASES = {"memory": "peak_bytes", "peak_memory": "peak_bytes", "kv": "kv_bytes"}
# The fidelity defaults: above every difference measured between reruns, seeds' shared samples and torch
# thread counts, below the smallest move of the mutation suite (docs/baselines.md, "Calibration").
DEFAULT_TOLERANCES = ("score:1.0", "kl:0.01", "agreement:0.01", "decode_kl:0.01")
SIDES = {"two-sided": True, "one-sided": False}


@dataclass(frozen=True)
class Tolerance:
    """How much worse a metric may get before the gate fails: absolute units or % of the baseline."""

    metric: str
    value: float
    relative: bool
    two_sided: bool = False  # a significant move in the better direction fails too

    def allowed(self, baseline_value: float) -> float:
        """The allowed change in the metric's own units for this baseline value."""
        if self.relative:
            return abs(baseline_value) * self.value / 100.0
        return self.value

    def __str__(self) -> str:
        side = "" if self.two_sided == METRICS[self.metric].two_sided else (
            ":two-sided" if self.two_sided else ":one-sided")
        return f"{self.metric}:{self.value:g}{'%' if self.relative else ''}{side}"


@dataclass(frozen=True)
class Tolerances:
    """The gated metrics and their tolerances; a metric absent here is shown but never fails."""

    items: tuple[Tolerance, ...]

    def get(self, metric: str) -> Tolerance | None:
        return next((t for t in self.items if t.metric == metric), None)

    def __contains__(self, metric: object) -> bool:
        return self.get(str(metric)) is not None

    def __iter__(self):
        return iter(self.items)

    def __str__(self) -> str:
        return ", ".join(str(t) for t in self.items) or "none"


def _parse_one(spec: str) -> tuple[str, Tolerance | None]:
    usage = (f"invalid tolerance {shown(spec)}: expected METRIC:VALUE or METRIC:VALUE% (or METRIC:off), "
             f"optionally followed by :two-sided or :one-sided, with METRIC one of {', '.join(METRICS)}")
    name, sep, raw = spec.partition(":")
    name = _ALIASES.get(name.strip().lower(), name.strip().lower())
    raw, side_sep, side = raw.strip().partition(":")
    raw, side = raw.strip(), side.strip().lower()
    if not sep or name not in METRICS or not raw or (side_sep and side not in SIDES):
        raise BaselineError(usage)
    two_sided = SIDES[side] if side_sep else METRICS[name].two_sided
    if raw.lower() == "off":
        if side_sep:
            raise BaselineError(f"invalid tolerance {shown(spec)}: a metric switched off has no side")
        return name, None
    relative = raw.endswith("%")
    number = raw[:-1] if relative else raw
    try:
        value = ascii_float(number)
    except ValueError:
        value = math.nan if _python_reads(number) else None  # nan, inf, '١': a number, but not a usable one
    if value is None:
        raise BaselineError(usage)
    if not math.isfinite(value) or value < 0:
        raise BaselineError(f"invalid tolerance {shown(spec)}: the value must be a finite number >= 0 in ASCII digits")
    span = METRICS[name].span
    if not relative and span is not None and value > span:
        raise BaselineError(f"invalid tolerance {shown(spec)}: {name} lies in 0-{span:g}, so a change of {value:g} "
                            f"can never fail; give at most {span:g} (or {name}:off)")
    return name, Tolerance(name, value, relative, two_sided)


def _python_reads(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_tolerances(spec_list: Sequence[str] | None) -> Tolerances:
    """Tolerances from ``--kvbench-compare-fail`` values (repeatable, comma-separated).

    ``score:1.0`` allows a drop of one point, ``latency:20%`` a 20% slowdown, ``score:off``
    stops gating the score, ``score:1.0:two-sided`` fails a significant rise too. The score and
    the fidelity figures are gated at DEFAULT_TOLERANCES unless given; latency and memory only
    when named.
    """
    chosen: dict[str, Tolerance | None] = {}
    try:  # an empty tolerance ('', 'score:1,') is refused, not skipped: the default would gate instead
        parts = split_list([str(text) for text in spec_list or ()], "tolerance list")
    except InputError as exc:
        raise BaselineError(str(exc)) from None
    given: dict[str, str] = {}
    for part in parts:
        name, tolerance = _parse_one(part)
        if name in chosen:
            raise BaselineError(f"tolerance for {name!r} is given twice ({given[name]} and {part}); give it once")
        chosen[name], given[name] = tolerance, part
    for default in DEFAULT_TOLERANCES:
        name, tolerance = _parse_one(default)
        chosen.setdefault(name, tolerance)
    return Tolerances(tuple(t for name in METRICS if (t := chosen.get(name)) is not None))
