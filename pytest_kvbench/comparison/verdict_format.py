"""How the gate prints numbers: values, changes, intervals and p-values per metric, and a check's table row."""

from __future__ import annotations

import math

MiB = 2**20

TABLE_HEADERS = ["item", "metric", "baseline", "current", "delta", "95% CI", "p (t-test)", "verdict"]


def _fmt(metric: str, value: float | None, sign: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if metric == "score":
        return f"{value:{sign}.2f}"
    if metric == "latency":
        return f"{value:{sign}.3f} s"
    if metric in ("kl", "agreement", "decode_kl"):
        return f"{value:{sign}.4f}"
    return f"{value / MiB:{sign}.2f} MiB"


def fmt_value(metric: str, value: float | None) -> str:
    """A metric's value in its unit: score points, seconds, nats / rates, MiB."""
    return _fmt(metric, value, "")


def fmt_delta(metric: str, value: float | None) -> str:
    """A change of a metric, always signed."""
    return _fmt(metric, value, "+")


def fmt_interval(metric: str, low: float | None, high: float | None) -> str:
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return "-"
    return f"[{fmt_delta(metric, low)}, {fmt_delta(metric, high)}]"


def fmt_p(p: float | None) -> str:
    if p is None or math.isnan(p):
        return "-"
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


RELATIVE_METRICS = ("latency", "kv_bytes", "peak_bytes")  # KL near 0 would print +25321829798.9%


def relative(check) -> str:
    """The change in % of the baseline, for the metrics where a ratio means something."""
    if check.metric not in RELATIVE_METRICS or check.delta is None or not check.baseline:
        return ""
    return f" ({100.0 * check.delta / abs(check.baseline):+.1f}%)"


def check_row(key: str, check) -> list[str]:
    delta = fmt_delta(check.metric, check.delta) + relative(check)
    verdict = check.status + (f" ({check.note})" if check.note else "")
    return [key, check.metric, fmt_value(check.metric, check.baseline), fmt_value(check.metric, check.current),
            delta, fmt_interval(check.metric, check.low, check.high), fmt_p(check.p), verdict]
