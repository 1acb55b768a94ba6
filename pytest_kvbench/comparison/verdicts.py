"""Baselines and the regression gate: --kvbench-save, --kvbench-compare, ``kvbench compare``.

A pull request must fail when it makes a method score worse and must not fail on noise. So an
item is a regression only when both hold:

* the drop is larger than the tolerance set for the metric (``score:1.0`` points by default), and
* a paired bootstrap over the *same sample ids* puts the whole 95% interval of the change on the
  worse side of zero.

A fixed threshold alone fires on noise, significance alone fires on negligible but consistent
changes; together they do neither. The paired t-test is reported next to the interval. Latency
is gated only when asked (CI machines are noisy), with per-sample timings as the paired data;
memory figures are deterministic and gated by threshold alone. A baseline entry is compared only
when the run measured the same thing (same sample ids, method parameters, protocol, metric):
otherwise the verdict is ``mismatch`` and says what differs, never a silent comparison.

This module judges; how a verdict reads (its message, table rows, the summary) is verdict_format.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pytest_kvbench.comparison.benchmark_changes import benchmark_changes, is_deterministic
from pytest_kvbench.comparison.tolerances import FIDELITY_METRICS, METRICS, Tolerance, Tolerances
from pytest_kvbench.comparison.verdict_format import (
    benchmark_message,
    failing_message,
    mismatch_message,
    new_message,
    passing_message,
    verdict_rows,
)
from pytest_kvbench.results.record import Record, is_number
from pytest_kvbench.stats import PairedResult, compare_paired

if TYPE_CHECKING:
    from pytest_kvbench.comparison.baseline_file import BaselineEntry

SCORE_SCALE = 100.0  # record scores are 100 x the mean per-sample score (DEVELOPERS.md, tasks)
# How far one sample's fidelity may move where the run is deterministic (the same CPU model, torch and threads as
# the baseline): 1e-4 of the value (at least 1e-4 absolute). Decoding the same samples alone
# (--kvbench-decode-batch 1) instead of batched rounds differently: on the smoke gate's niah_single_1 items up to
# 1.1e-5 in kl and 3.6e-5 (5e-6 of the value) in decode_kl, agreement equal; batches of other sizes gave bitwise
# the same values. The held-out bug this is for (Expected Attention's future queries rotated the wrong way round)
# moved every sample's kl by 1.2e-3 to 5.9e-3 at a KL of 16-19, below the statistical tolerance.
FIDELITY_ROUNDING = 1e-4
FAILING = ("regression", "changed", "benchmark")
# changed: a two-sided metric moved significantly the better way; benchmark: what was measured changed (not compared)


# -- comparing one record with its entry --------------------------------------------------------


@dataclass
class MetricCheck:
    """One metric of one item: values, change, interval and the metric's own verdict."""

    metric: str
    baseline: float | None
    current: float | None
    delta: float | None
    low: float | None = None
    high: float | None = None
    p: float | None = None
    n: int = 0
    tolerance: Tolerance | str | None = None  # a str when read back from a record
    status: str = "ok"
    note: str = ""


@dataclass
class Verdict:
    """The gate's answer for one item; ``message`` is written for an assertion failure."""

    key: str
    status: str
    checks: list[MetricCheck] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    message: str = ""

    @property
    def failed(self) -> bool:
        return self.status in FAILING

    @property
    def rows(self) -> list[list[str]]:
        """Table rows: one per compared metric, or one describing a new or mismatched item."""
        return verdict_rows(self)

    @property
    def row(self) -> list[str]:
        return self.rows[0]

    def as_dict(self) -> dict:
        """JSON-ready form: the record's ``verdict`` (``from_dict`` reads it back)."""
        return {
            "key": self.key, "status": self.status, "message": self.message, "reasons": list(self.reasons),
            "checks": [{
                "metric": c.metric, "baseline": c.baseline, "current": c.current, "delta": c.delta,
                "ci_low": _json_number(c.low), "ci_high": _json_number(c.high), "p": _json_number(c.p), "n": c.n,
                "tolerance": str(c.tolerance) if c.tolerance else None, "status": c.status, "note": c.note,
            } for c in self.checks],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Verdict:
        """The verdict an item attached to its record, for the controller's comparison table."""
        checks = [MetricCheck(c["metric"], c.get("baseline"), c.get("current"), c.get("delta"), c.get("ci_low"),
                              c.get("ci_high"), c.get("p"), c.get("n") or 0, c.get("tolerance"),
                              c.get("status", "ok"), c.get("note", ""))
                  for c in data.get("checks") or []]
        return cls(data["key"], data["status"], checks, list(data.get("reasons") or []), data.get("message", ""))


def _json_number(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _samples_by_id(samples: list[dict]) -> tuple[dict[str, dict], list[str]]:
    """Samples keyed by id (as text), and the ids that occur more than once."""
    by_id: dict[str, dict] = {}
    duplicates = []
    for sample in samples:
        sid = str(sample.get("id"))
        if sid in by_id:
            duplicates.append(sid)
        by_id[sid] = sample
    return by_id, duplicates


def _describe_ids(ids: list[str]) -> str:
    shown = ", ".join(repr(i) for i in sorted(ids)[:3])
    return f"{len(ids)} ({shown}{', ...' if len(ids) > 3 else ''})"


def _weights(gguf_sha256: str | None) -> str:
    return f"GGUF sha256 {gguf_sha256[:12]}..." if gguf_sha256 else "not from a GGUF file"


def _settings_mismatch(record: Record, entry: BaselineEntry) -> list[str]:
    """Every reason why the record did not measure what the entry measured."""
    reasons = []
    base_params = (entry.method.params if entry.method else None) or {}
    cur_params = record.method.params or {}
    if base_params != cur_params:
        changed = sorted(k for k in set(base_params) | set(cur_params) if base_params.get(k) != cur_params.get(k))
        detail = ", ".join(f"{k}: {base_params.get(k)!r} -> {cur_params.get(k)!r}" for k in changed)
        reasons.append(f"method parameters differ ({detail})")
    for name in ("dtype", "attn_implementation"):
        base, cur = getattr(entry.model, name), getattr(record.model, name)
        if base is not None and cur is not None and base != cur:
            reasons.append(f"model {name.replace('_', ' ')} differs (baseline {base!r}, this run {cur!r})")
    if entry.model.gguf_sha256 != record.model.gguf_sha256:  # a name (smollm2-135m) may load a GGUF file or floats
        reasons.append(f"model weights differ (baseline {_weights(entry.model.gguf_sha256)}, "
                       f"this run {_weights(record.model.gguf_sha256)})")
    for name, base, cur in (
        ("protocol", entry.protocol, record.protocol),
        # None is the model's maximum; baselines from before the field was recorded used it
        ("max prompt tokens", entry.max_prompt_tokens, record.max_prompt_tokens),
        ("metric", entry.metric, record.metric),
        ("context length", entry.task.context_length if entry.task else None, record.task.context_length),
    ):
        if base != cur:
            reasons.append(f"{name} differs (baseline {base!r}, this run {cur!r})")
    base_samples, base_dupes = _samples_by_id(entry.samples)
    cur_samples, cur_dupes = _samples_by_id(record.samples)
    if base_dupes or cur_dupes:
        reasons.append(f"sample ids repeat ({_describe_ids(base_dupes + cur_dupes)}), so samples cannot be paired")
    elif not base_samples or not cur_samples:
        reasons.append("no per-sample scores to pair (" + ("baseline" if not base_samples else "this run") + ")")
    elif set(base_samples) != set(cur_samples):
        only_base = sorted(set(base_samples) - set(cur_samples))
        only_cur = sorted(set(cur_samples) - set(base_samples))
        parts = []
        if only_base:
            parts.append(f"{_describe_ids(only_base)} only in the baseline")
        if only_cur:
            parts.append(f"{_describe_ids(only_cur)} only in this run")
        reasons.append("sample ids differ (" + "; ".join(parts) + ")")
    else:
        for side, samples in (("the baseline", base_samples), ("this run", cur_samples)):
            if any(not is_number(s.get("score")) for s in samples.values()):
                reasons.append(f"per-sample scores missing in {side}")
    return reasons


def _judge_paired(check: MetricCheck, result: PairedResult, tolerance: Tolerance | None,
                  higher_is_better: bool) -> MetricCheck:
    """The check's status from its paired result: worse beyond the tolerance and significant is a regression;
    better beyond it and significant is ``changed`` under a two-sided tolerance (it fails), else ``improved``."""
    if tolerance is None:
        check.note = "not gated"
        return check
    allowed = tolerance.allowed(check.baseline)
    sign = 1.0 if higher_is_better else -1.0
    worse = sign * result.mean_diff < -allowed and (result.significant_drop if higher_is_better
                                                     else result.significant_rise)
    better = sign * result.mean_diff > allowed and (result.significant_rise if higher_is_better
                                                     else result.significant_drop)
    if worse:
        check.status = "regression"
    elif better:
        check.status = "changed" if tolerance.two_sided else "improved"
    elif abs(result.mean_diff) > allowed:
        check.note = "not significant"
    return check


def _check_score(record: Record, entry: BaselineEntry, tolerance: Tolerance | None, seed: int) -> MetricCheck:
    base, _ = _samples_by_id(entry.samples)
    cur, _ = _samples_by_id(record.samples)
    ids = list(base)  # baseline order: a stable pairing order keeps the bootstrap reproducible
    result = compare_paired([SCORE_SCALE * base[i]["score"] for i in ids],
                            [SCORE_SCALE * cur[i]["score"] for i in ids], seed=seed)
    check = MetricCheck("score", float(entry.score), float(record.score), result.mean_diff,
                        result.low, result.high, result.p, result.n, tolerance)
    return _judge_paired(check, result, tolerance, higher_is_better=True)


def _fidelity_checks(record: Record, entry: BaselineEntry, tolerances: Tolerances, seed: int) -> list[MetricCheck]:
    """KL to the full cache (teacher-forced and along the greedy decode) and greedy agreement, paired per
    sample and gated two-sided by default: they need no labels, so they move even where a task score is
    flat (a small model, few samples, a budget where every method scores 0 or 100). Where the run is
    deterministic they are also held per sample to float rounding (_held_to_rounding)."""
    base, _ = _samples_by_id(entry.samples)
    cur, _ = _samples_by_id(record.samples)
    exact = is_deterministic(record, entry)
    checks = []
    for metric in FIDELITY_METRICS:
        ids = [i for i in base if is_number(base[i].get(metric)) and is_number(cur.get(i, {}).get(metric))]
        if not ids:
            continue
        before = [base[i][metric] for i in ids]
        after = [cur[i][metric] for i in ids]
        result = compare_paired(before, after, seed=seed)
        tolerance = tolerances.get(metric)
        check = MetricCheck(metric, sum(before) / len(before), sum(after) / len(after), result.mean_diff,
                            result.low, result.high, result.p, result.n, tolerance)
        check = _judge_paired(check, result, tolerance, METRICS[metric].higher_is_better)
        if exact and tolerance is not None and tolerance.two_sided and check.status not in FAILING:
            _held_to_rounding(check, before, after)
        checks.append(check)
    return checks


def _held_to_rounding(check: MetricCheck, before: list[float], after: list[float]) -> None:
    """On the same CPU, torch and threads a sample's fidelity is a function of the code and its inputs: a move
    past float rounding means the method computes something else, whichever way it goes and however small
    against the statistical tolerance (a one-sided gate never fails an improvement). ``changed`` (it fails)."""
    moved = [abs(a - b) > FIDELITY_ROUNDING * max(1.0, abs(b)) for b, a in zip(before, after)]
    if any(moved):
        check.status = "changed"
        check.note = (f"{sum(moved)} of {len(moved)} samples moved past float rounding on the same CPU, torch and "
                      f"threads: the method computes something else")
        check.tolerance = f"{check.metric}: {FIDELITY_ROUNDING:g} of each sample's value (a deterministic run)"


def _sample_seconds(sample: dict) -> float | None:
    prefill, decode = sample.get("prefill_ms"), sample.get("decode_ms")
    if is_number(prefill) and is_number(decode):
        return (prefill + decode) / 1000.0
    return None


def _check_latency(record: Record, entry: BaselineEntry, tolerance: Tolerance, seed: int) -> MetricCheck:
    base, _ = _samples_by_id(entry.samples)
    cur, _ = _samples_by_id(record.samples)
    ids = list(base)
    base_s = [_sample_seconds(base[i]) for i in ids]
    cur_s = [_sample_seconds(cur[i]) for i in ids]
    if ids and None not in base_s and None not in cur_s:
        result: PairedResult = compare_paired(base_s, cur_s, seed=seed)
        n = result.n
        check = MetricCheck("latency", sum(base_s), sum(cur_s), n * result.mean_diff,
                            n * result.low, n * result.high, result.p, n, tolerance)
        significant = result.significant_rise
    else:
        base_total = entry.latency.total_s
        cur_total = record.latency.total_s
        if not (is_number(base_total) and is_number(cur_total)):
            return MetricCheck("latency", None, None, None, tolerance=tolerance, note="not measured")
        check = MetricCheck("latency", base_total, cur_total, cur_total - base_total, tolerance=tolerance,
                            note="no per-sample timings: threshold only")
        significant = True
    if check.delta > tolerance.allowed(check.baseline) and significant:
        check.status = "regression"
    return check


def _check_memory(metric: str, record: Record, entry: BaselineEntry, tolerance: Tolerance) -> MetricCheck:
    field_name = "kv_bytes_after" if metric == "kv_bytes" else "peak_bytes"
    base = getattr(entry.memory, field_name)
    cur = getattr(record.memory, field_name)
    if not (is_number(base) and is_number(cur)):
        return MetricCheck(metric, base if is_number(base) else None, cur if is_number(cur) else None,
                           None, tolerance=tolerance, note="not measured")
    check = MetricCheck(metric, float(base), float(cur), float(cur - base), tolerance=tolerance, note="deterministic")
    if check.delta > tolerance.allowed(check.baseline):
        check.status = "regression"
        check.note = ""
    return check


def compare_record(record: Record, entry: BaselineEntry | None, tolerances: Tolerances, *, seed: int = 0) -> Verdict:
    """Compare one finished item with its baseline entry (None: the item is new)."""
    key = str(record.key)
    current_score = record.score if record.is_scored else None
    if entry is None:
        return Verdict(key, "new", [MetricCheck("score", None, current_score, None)],
                       message=new_message(key, current_score))
    changes = benchmark_changes(record, entry) if current_score is not None else None
    if changes:  # before the scores: a changed benchmark is not compared as if it were the same
        return Verdict(key, "benchmark", [MetricCheck("score", float(entry.score), current_score, None)], changes,
                       message=benchmark_message(key, changes))
    reasons = []
    if current_score is None:
        reasons.append(f"no score in this run (status {record.status or 'unknown'})")
    else:
        reasons.extend(_settings_mismatch(record, entry))
    if reasons:
        return Verdict(key, "mismatch", [MetricCheck("score", float(entry.score), current_score, None)], reasons,
                       message=mismatch_message(key, reasons))
    checks = [_check_score(record, entry, tolerances.get("score"), seed)]
    checks += _fidelity_checks(record, entry, tolerances, seed)
    for tolerance in tolerances:
        if tolerance.metric == "latency":
            checks.append(_check_latency(record, entry, tolerance, seed))
        elif tolerance.metric in ("kv_bytes", "peak_bytes"):
            checks.append(_check_memory(tolerance.metric, record, entry, tolerance))
    failing = [c for c in checks if c.status in FAILING]
    if failing:
        status = "regression" if any(c.status == "regression" for c in failing) else "changed"
        return Verdict(key, status, checks, message=failing_message(key, status, failing))
    score = checks[0]
    status = "improved" if score.status == "improved" else "ok"
    return Verdict(key, status, checks, message=passing_message(key, status, score))
