"""How the gate's verdicts read: numbers per metric (values, changes, intervals, p-values), a verdict's message
and table rows, the comparison table and its summary. comparison/verdicts.py judges and calls these; nothing here
decides a status, so the text can change without touching the gate."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tabulate import tabulate

from pytest_kvbench.comparison.tolerances import FIDELITY_METRICS, Tolerances

MiB = 2**20

STATUSES = ("ok", "regression", "changed", "improved", "new", "mismatch", "benchmark")  # the verdicts, summary order
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


def verdict_rows(verdict) -> list[list[str]]:
    """A verdict's table rows: one per compared metric, or one describing a new, mismatched or changed item."""
    if verdict.status in ("new", "mismatch", "benchmark"):
        shown = verdict.status if verdict.status == "new" else \
            {"mismatch": "mismatch: ", "benchmark": "benchmark changed: "}[verdict.status] + \
            "; ".join(r.split(" (")[0] for r in verdict.reasons)
        metric, baseline, current = ((verdict.checks[0].metric, verdict.checks[0].baseline, verdict.checks[0].current)
                                     if verdict.checks else ("score", None, None))
        return [[verdict.key, metric, fmt_value(metric, baseline), fmt_value(metric, current), "-", "-", "-", shown]]
    return [check_row(verdict.key, check) for check in verdict.checks]


_DIRECTION = {"kl": ("higher", "lower"), "decode_kl": ("higher", "lower"), "agreement": ("lower", "higher")}


def _direction(check) -> str:
    """Which way a failing metric moved, in words (fidelity: away from or towards the full cache)."""
    if check.metric in _DIRECTION:
        worse, better = _DIRECTION[check.metric]
        rose = (check.delta or 0.0) > 0
        if check.status == "regression" or rose == (worse == "higher"):
            return f"{check.metric} {worse} (further from the full cache):"
        return f"{check.metric} {better} (closer to the full cache: the method changed):"
    if check.status == "changed":
        return f"{check.metric} rose (two-sided):"
    return check.metric


def _regression_text(check) -> str:
    unit = " points" if check.metric == "score" else ""
    stats = []
    if check.low is not None and check.high is not None and not math.isnan(check.low):
        stats.append(f"95% CI {fmt_delta(check.metric, check.low)} to {fmt_delta(check.metric, check.high)}")
    if check.p is not None and not math.isnan(check.p):
        stats.append(f"paired t-test p={fmt_p(check.p)}")
    if check.n:
        stats.append(f"n={check.n}")
    if check.note:
        stats.append(check.note)
    return (f"{_direction(check)} baseline {fmt_value(check.metric, check.baseline)}, current "
            f"{fmt_value(check.metric, check.current)}, difference {fmt_delta(check.metric, check.delta)}{unit}"
            f"{relative(check)}"
            + (f" ({'; '.join(stats)})" if stats else "")
            + f", beyond the tolerance {check.tolerance}")


INTENDED = "if the change is intended, record a new baseline with --kvbench-save (--kvbench-save-force to replace it)"


def new_message(key: str, score: float | None) -> str:
    return f"{key}: new item, not in the baseline (score {fmt_value('score', score)})"


def mismatch_message(key: str, reasons: list[str]) -> str:
    return f"{key}: not compared with the baseline: " + "; ".join(reasons)


def benchmark_message(key: str, changes: list[str]) -> str:
    """A baseline entry whose benchmark changed (prompt, settings, metric version, reference output): not compared."""
    return f"{key}: benchmark changed: " + "; ".join(changes) + f"; not compared; {INTENDED}"


def failing_message(key: str, status: str, failing: list) -> str:
    """The assertion message of a regression or a two-sided change: every failing check, then what to do."""
    what = "regression against the baseline" if status == "regression" else "changed against the baseline"
    return f"{key}: {what}: " + "; ".join(_regression_text(c) for c in failing) + f"; {INTENDED}"


def passing_message(key: str, status: str, score) -> str:
    """An ok or improved item's message: its score check's change and interval."""
    return (f"{key}: {status}: score baseline {fmt_value('score', score.baseline)}, current "
            f"{fmt_value('score', score.current)}, difference {fmt_delta('score', score.delta)} "
            f"(95% CI {fmt_interval('score', score.low, score.high)}, paired t-test p={fmt_p(score.p)})")


def comparison_table(verdicts: Sequence, tablefmt: str = "simple") -> str:
    """The comparison table for the terminal summary and ``kvbench compare``."""
    rows = [row for verdict in verdicts for row in verdict.rows]
    return tabulate(rows, headers=TABLE_HEADERS, tablefmt=tablefmt, disable_numparse=True)


def score_alone_note(baseline, tolerances: Tolerances) -> str | None:
    """The one line saying a baseline without fidelity figures is judged on the score alone (None otherwise)."""
    gated = [m for m in FIDELITY_METRICS if m in tolerances]
    if not gated or baseline is None or baseline.has_fidelity:
        return None
    return (f"baseline {baseline.source or ''} has no per-sample fidelity figures ({', '.join(gated)}): gating on the "
            f"score alone; save it again with --kvbench-save to gate on fidelity").replace("baseline  ", "baseline ")


def comparison_summary(verdicts: Sequence, unrun: Sequence[str] = ()) -> str:
    """Counts per verdict, then what needs attention: mismatches (with reasons) and unrun entries."""
    counts = {status: sum(v.status == status for v in verdicts) for status in STATUSES}
    parts = [f"{counts[s]} {s}" for s in STATUSES if counts[s]]
    if unrun:
        parts.append(f"{len(unrun)} baseline entr{'y' if len(unrun) == 1 else 'ies'} not run")
    lines = ["kvbench compare: " + (", ".join(parts) or "nothing compared")]
    lines += [f"  mismatch {v.key}: {'; '.join(v.reasons)}" for v in verdicts if v.status == "mismatch"]
    lines += [f"  benchmark changed {v.key}: {'; '.join(v.reasons)}" for v in verdicts if v.status == "benchmark"]
    lines += [f"  not run: {key}" for key in unrun]
    return "\n".join(lines)
