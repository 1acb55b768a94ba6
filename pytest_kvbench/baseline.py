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
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from tabulate import tabulate

from pytest_kvbench import user_paths
from pytest_kvbench.runs import is_scored
from pytest_kvbench.stats import PairedResult, compare_paired

FORMAT = "kvbench-baseline"
VERSION = 1
SCORE_SCALE = 100.0  # record scores are 100 x the mean per-sample score (DEVELOPERS.md, tasks)
STATUSES = ("ok", "regression", "improved", "new", "mismatch")
MiB = 2**20


class BaselineError(ValueError):
    """A baseline or tolerance that cannot be used; one line, naming the file and what is wrong."""


# -- tolerances -------------------------------------------------------------------------------


@dataclass(frozen=True)
class GatedMetric:
    """A metric the gate knows: where its value lives and which direction is worse."""

    name: str
    higher_is_better: bool
    unit: str
    help: str


METRICS = {
    "score": GatedMetric("score", True, "points", "task score (0-100); absolute points or % of the baseline"),
    "latency": GatedMetric("latency", False, "s", "item latency; seconds or % of the baseline"),
    "kv_bytes": GatedMetric("kv_bytes", False, "bytes", "KV cache kept after compression; bytes or %"),
    "peak_bytes": GatedMetric("peak_bytes", False, "bytes", "peak accelerator/process memory; bytes or %"),
}
_ALIASES = {"memory": "peak_bytes", "peak_memory": "peak_bytes", "kv": "kv_bytes"}
DEFAULT_TOLERANCES = ("score:1.0",)


@dataclass(frozen=True)
class Tolerance:
    """How much worse a metric may get before the gate fails: absolute units or % of the baseline."""

    metric: str
    value: float
    relative: bool

    def allowed(self, baseline_value: float) -> float:
        """The allowed change in the metric's own units for this baseline value."""
        if self.relative:
            return abs(baseline_value) * self.value / 100.0
        return self.value

    def __str__(self) -> str:
        return f"{self.metric}:{self.value:g}{'%' if self.relative else ''}"


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
    usage = (f"invalid tolerance {spec!r}: expected METRIC:VALUE or METRIC:VALUE% (or METRIC:off) "
             f"with METRIC one of {', '.join(METRICS)}")
    name, sep, raw = spec.partition(":")
    name = _ALIASES.get(name.strip().lower(), name.strip().lower())
    raw = raw.strip()
    if not sep or name not in METRICS or not raw:
        raise BaselineError(usage)
    if raw.lower() == "off":
        return name, None
    relative = raw.endswith("%")
    try:
        value = float(raw[:-1] if relative else raw)
    except ValueError:
        raise BaselineError(usage) from None
    if not math.isfinite(value) or value < 0:
        raise BaselineError(f"invalid tolerance {spec!r}: the value must be a finite number >= 0")
    return name, Tolerance(name, value, relative)


def parse_tolerances(spec_list: Sequence[str] | None) -> Tolerances:
    """Tolerances from ``--kvbench-compare-fail`` values (repeatable, comma-separated).

    ``score:1.0`` allows a drop of one point, ``latency:20%`` a 20% slowdown, ``score:off``
    stops gating the score. The score is gated at 1.0 point unless given; latency and memory
    only when named.
    """
    chosen: dict[str, Tolerance | None] = {}
    for part in (p.strip() for text in (spec_list or ()) for p in str(text).split(",")):
        if not part:
            continue
        name, tolerance = _parse_one(part)
        if name in chosen:
            raise BaselineError(f"tolerance for {name!r} is given twice")
        chosen[name] = tolerance
    for default in DEFAULT_TOLERANCES:
        name, tolerance = _parse_one(default)
        chosen.setdefault(name, tolerance)
    return Tolerances(tuple(t for name in METRICS if (t := chosen.get(name)) is not None))


# -- entries: what a baseline keeps of a record -----------------------------------------------


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def baseline_entry(record: dict) -> dict:
    """The part of a record a baseline needs: identity, settings, score, per-sample data, cost."""
    model = record.get("model") or {}
    return {
        "key": record["key"],
        "item_id": record.get("item_id"),
        "model": {k: model.get(k) for k in ("name", "dtype", "attn_implementation") if k in model},
        "method": record.get("method"),
        "budget": record.get("budget"),
        "protocol": record.get("protocol"),
        "max_prompt_tokens": record.get("max_prompt_tokens"),
        "seed": record.get("seed"),
        "task": record.get("task"),
        "metric": record.get("metric"),
        "score": record["score"],
        "n_samples": record.get("n_samples"),
        "samples": [
            {k: s.get(k) for k in ("id", "score", "prefill_ms", "decode_ms", "kl", "agreement")}
            for s in record.get("samples") or []
        ],
        "latency": record.get("latency"),
        "memory": record.get("memory"),
        "device": record.get("device"),
    }


# -- the baseline -----------------------------------------------------------------------------


@dataclass
class Baseline:
    """Baseline entries by comparison key, with the environment they were measured in."""

    entries: dict[str, dict]
    environment: dict = field(default_factory=dict)
    source: str = ""
    created: str | None = None
    run_id: str | None = None

    def entry(self, record: dict) -> dict | None:
        return self.entries.get(record.get("key"))

    def unrun(self, keys_seen: Iterable[str]) -> list[str]:
        """Baseline entries that this run did not produce (listed, not failed)."""
        seen = set(keys_seen)
        return sorted(k for k in self.entries if k not in seen)

    @classmethod
    def from_records(cls, records: Iterable[dict], environment: dict | None = None, source: str = "") -> Baseline:
        """An in-memory baseline from a run's records (``kvbench compare A B`` uses run A)."""
        entries: dict[str, dict] = {}
        run_ids = set()
        for record in records:
            if not is_scored(record):
                continue
            if record["key"] in entries:
                raise BaselineError(f"{source or 'records'}: item {record['key']} appears twice")
            entries[record["key"]] = baseline_entry(record)
            run_ids.add(record.get("run_id"))
        return cls(entries=entries, environment=dict(environment or {}), source=source,
                   run_id=next(iter(run_ids)) if len(run_ids) == 1 else None)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "created": self.created, "run_id": self.run_id,
                "environment": self.environment, "entries": self.entries}


def check_save_target(path: str | os.PathLike, force: bool) -> None:
    """Refuse a --kvbench-save target at configure time, before an hour of benchmarking is spent."""
    try:
        target, exists = user_paths.writable_file(path, "cannot save baseline")
    except user_paths.PathError as exc:
        raise BaselineError(str(exc)) from None
    if exists and not force:
        raise BaselineError(f"baseline {user_paths.shown(target)} already exists; pass --kvbench-save-force to replace it")


def write_baseline(path: str | os.PathLike, records: list[dict], environment: dict, force: bool) -> None:
    """Save the run's scored items as a baseline; refuses to replace a file unless ``force``."""
    from pytest_kvbench.storage import atomic_write_json

    target = Path(path)
    check_save_target(target, force)
    scored = [r for r in records if is_scored(r)]
    if not scored:
        raise BaselineError(f"nothing to save in baseline {target}: no item produced a score")
    baseline = Baseline.from_records(scored, environment, source=str(target))
    baseline.created = datetime.now().astimezone().isoformat(timespec="seconds")
    try:
        atomic_write_json(target, baseline.to_json())
    except OSError as exc:
        raise BaselineError(f"cannot write baseline {target}: {exc.strerror or exc}") from None


def _check_entry(path: Path, key: object, entry: object) -> None:
    where = f"{path}: entry {key!r}"
    if not isinstance(entry, dict):
        raise BaselineError(f"{where} is not an object")
    if entry.get("key", key) != key:
        raise BaselineError(f"{where} has a different 'key' inside ({entry.get('key')!r})")
    if not _is_number(entry.get("score")):
        raise BaselineError(f"{where} has no numeric 'score'")
    samples = entry.get("samples")
    if not isinstance(samples, list):
        raise BaselineError(f"{where} has no 'samples' list")
    for number, sample in enumerate(samples, start=1):
        if not isinstance(sample, dict) or not isinstance(sample.get("id"), (str, int)) or isinstance(sample.get("id"), bool):
            raise BaselineError(f"{where}: sample {number} has no 'id'")
        if not _is_number(sample.get("score")):
            raise BaselineError(f"{where}: sample {sample['id']!r} has no numeric 'score'")
    for name in ("method", "latency", "memory", "task"):
        if entry.get(name) is not None and not isinstance(entry.get(name), dict):
            raise BaselineError(f"{where}: {name!r} must be an object")


def load_baseline(path: str | os.PathLike) -> Baseline:
    """Read and validate a baseline file; every problem is a one-line BaselineError naming it."""
    source = Path(path)
    try:
        user_paths.checked(source, "baseline")
    except user_paths.PathError as exc:
        raise BaselineError(str(exc)) from None
    if not source.exists():
        raise BaselineError(f"baseline {source} does not exist (write one with --kvbench-save {source})")
    if source.is_dir():
        raise BaselineError(f"baseline {source} is a directory, not a file")
    try:
        text = source.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BaselineError(f"baseline {source} is not UTF-8 text") from None
    except OSError as exc:
        raise BaselineError(f"cannot read baseline {source}: {exc.strerror or exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BaselineError(f"baseline {source}: invalid JSON at line {exc.lineno} column {exc.colno} ({exc.msg})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise BaselineError(f"baseline {source} is not a kvbench baseline (no \"format\": \"{FORMAT}\")")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise BaselineError(f"baseline {source}: 'version' must be an integer")
    if version > VERSION:
        raise BaselineError(f"baseline {source} has format version {version}; this kvbench reads up to {VERSION}")
    entries = data.get("entries")
    if not isinstance(entries, dict):
        raise BaselineError(f"baseline {source}: 'entries' must be an object keyed by item key")
    if not entries:
        raise BaselineError(f"baseline {source} has no entries: nothing to compare against")
    for key, entry in entries.items():
        _check_entry(source, key, entry)
    environment = data.get("environment")
    return Baseline(entries=entries, environment=environment if isinstance(environment, dict) else {},
                    source=str(source), created=data.get("created"), run_id=data.get("run_id"))


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
    tolerance: Tolerance | None = None
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
        return self.status == "regression"

    @property
    def rows(self) -> list[list[str]]:
        """Table rows: one per compared metric, or one describing a new or mismatched item."""
        if self.status in ("new", "mismatch"):
            verdict = self.status if self.status == "new" else "mismatch: " + "; ".join(r.split(" (")[0] for r in self.reasons)
            check = self.checks[0] if self.checks else MetricCheck("score", None, None, None)
            return [[self.key, check.metric, _fmt_value(check.metric, check.baseline),
                     _fmt_value(check.metric, check.current), "-", "-", "-", verdict]]
        return [_check_row(self.key, check) for check in self.checks]

    @property
    def row(self) -> list[str]:
        return self.rows[0]

    def as_dict(self) -> dict:
        """JSON-ready form, e.g. to attach to the item's record as ``comparison``."""
        return {
            "key": self.key, "status": self.status, "message": self.message, "reasons": list(self.reasons),
            "checks": [{
                "metric": c.metric, "baseline": c.baseline, "current": c.current, "delta": c.delta,
                "ci_low": _json_number(c.low), "ci_high": _json_number(c.high), "p": _json_number(c.p), "n": c.n,
                "tolerance": str(c.tolerance) if c.tolerance else None, "status": c.status, "note": c.note,
            } for c in self.checks],
        }


def _json_number(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


TABLE_HEADERS = ["item", "metric", "baseline", "current", "delta", "95% CI", "p (t-test)", "verdict"]


def _fmt_value(metric: str, value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if metric == "score":
        return f"{value:.2f}"
    if metric == "latency":
        return f"{value:.3f} s"
    if metric in ("kl", "agreement"):
        return f"{value:.4f}"
    return f"{value / MiB:.2f} MiB"


def _fmt_delta(metric: str, value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if metric == "score":
        return f"{value:+.2f}"
    if metric == "latency":
        return f"{value:+.3f} s"
    if metric in ("kl", "agreement"):
        return f"{value:+.4f}"
    return f"{value / MiB:+.2f} MiB"


def _fmt_interval(metric: str, low: float | None, high: float | None) -> str:
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return "-"
    return f"[{_fmt_delta(metric, low)}, {_fmt_delta(metric, high)}]"


def _fmt_p(p: float | None) -> str:
    if p is None or math.isnan(p):
        return "-"
    return f"{p:.2g}" if p < 0.001 else f"{p:.3f}"


RELATIVE_METRICS = ("latency", "kv_bytes", "peak_bytes")  # KL near 0 would print +25321829798.9%


def _relative(check: MetricCheck) -> str:
    if check.metric not in RELATIVE_METRICS or check.delta is None or not check.baseline:
        return ""
    return f" ({100.0 * check.delta / abs(check.baseline):+.1f}%)"


def _check_row(key: str, check: MetricCheck) -> list[str]:
    delta = _fmt_delta(check.metric, check.delta) + _relative(check)
    verdict = check.status + (f" ({check.note})" if check.note else "")
    return [key, check.metric, _fmt_value(check.metric, check.baseline), _fmt_value(check.metric, check.current),
            delta, _fmt_interval(check.metric, check.low, check.high), _fmt_p(check.p), verdict]


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


def _settings_mismatch(record: dict, entry: dict) -> list[str]:
    """Every reason why the record did not measure what the entry measured."""
    reasons = []
    base_params = (entry.get("method") or {}).get("params") or {}
    cur_params = (record.get("method") or {}).get("params") or {}
    if base_params != cur_params:
        changed = sorted(k for k in set(base_params) | set(cur_params) if base_params.get(k) != cur_params.get(k))
        detail = ", ".join(f"{k}: {base_params.get(k)!r} -> {cur_params.get(k)!r}" for k in changed)
        reasons.append(f"method parameters differ ({detail})")
    base_model, cur_model = entry.get("model") or {}, record.get("model") or {}
    for name in ("dtype", "attn_implementation"):
        if base_model.get(name) is not None and cur_model.get(name) is not None and base_model[name] != cur_model[name]:
            reasons.append(f"model {name.replace('_', ' ')} differs (baseline {base_model[name]!r}, this run {cur_model[name]!r})")
    for name, base, cur in (
        ("protocol", entry.get("protocol"), record.get("protocol")),
        # None is the model's maximum; baselines from before the field was recorded used it
        ("max prompt tokens", entry.get("max_prompt_tokens"), record.get("max_prompt_tokens")),
        ("metric", entry.get("metric"), record.get("metric")),
        ("context length", (entry.get("task") or {}).get("context_length"), (record.get("task") or {}).get("context_length")),
    ):
        if base != cur:
            reasons.append(f"{name} differs (baseline {base!r}, this run {cur!r})")
    base_samples, base_dupes = _samples_by_id(entry.get("samples") or [])
    cur_samples, cur_dupes = _samples_by_id(record.get("samples") or [])
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
            if any(not _is_number(s.get("score")) for s in samples.values()):
                reasons.append(f"per-sample scores missing in {side}")
    return reasons


def _check_score(record: dict, entry: dict, tolerance: Tolerance | None, seed: int) -> MetricCheck:
    base, _ = _samples_by_id(entry["samples"])
    cur, _ = _samples_by_id(record["samples"])
    ids = list(base)  # baseline order: a stable pairing order keeps the bootstrap reproducible
    result = compare_paired([SCORE_SCALE * base[i]["score"] for i in ids],
                            [SCORE_SCALE * cur[i]["score"] for i in ids], seed=seed)
    check = MetricCheck("score", float(entry["score"]), float(record["score"]), result.mean_diff,
                        result.low, result.high, result.p, result.n, tolerance)
    if tolerance is None:
        check.note = "not gated"
        return check
    allowed = tolerance.allowed(check.baseline)
    if result.mean_diff < -allowed and result.significant_drop:
        check.status = "regression"
    elif result.mean_diff > allowed and result.significant_rise:
        check.status = "improved"
    elif abs(result.mean_diff) > allowed:
        check.note = "not significant"
    return check


def _fidelity_checks(record: dict, entry: dict, seed: int) -> list[MetricCheck]:
    """KL to the full cache and greedy agreement, paired per sample: reported beside the score, never gated.

    They need no labels, so they move even where a task score is flat (a small model, few samples).
    """
    base, _ = _samples_by_id(entry["samples"])
    cur, _ = _samples_by_id(record["samples"])
    checks = []
    for metric in ("agreement", "kl"):
        ids = [i for i in base if _is_number(base[i].get(metric)) and _is_number(cur.get(i, {}).get(metric))]
        if not ids:
            continue
        before = [base[i][metric] for i in ids]
        after = [cur[i][metric] for i in ids]
        result = compare_paired(before, after, seed=seed)
        checks.append(MetricCheck(metric, sum(before) / len(before), sum(after) / len(after), result.mean_diff,
                                  result.low, result.high, result.p, result.n, None, note="not gated"))
    return checks


def _sample_seconds(sample: dict) -> float | None:
    prefill, decode = sample.get("prefill_ms"), sample.get("decode_ms")
    if _is_number(prefill) and _is_number(decode):
        return (prefill + decode) / 1000.0
    return None


def _check_latency(record: dict, entry: dict, tolerance: Tolerance, seed: int) -> MetricCheck:
    base, _ = _samples_by_id(entry["samples"])
    cur, _ = _samples_by_id(record["samples"])
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
        base_total = (entry.get("latency") or {}).get("total_s")
        cur_total = (record.get("latency") or {}).get("total_s")
        if not (_is_number(base_total) and _is_number(cur_total)):
            return MetricCheck("latency", None, None, None, tolerance=tolerance, note="not measured")
        check = MetricCheck("latency", base_total, cur_total, cur_total - base_total, tolerance=tolerance,
                            note="no per-sample timings: threshold only")
        significant = True
    if check.delta > tolerance.allowed(check.baseline) and significant:
        check.status = "regression"
    return check


def _check_memory(metric: str, record: dict, entry: dict, tolerance: Tolerance) -> MetricCheck:
    field_name = "kv_bytes_after" if metric == "kv_bytes" else "peak_bytes"
    base = (entry.get("memory") or {}).get(field_name)
    cur = (record.get("memory") or {}).get(field_name)
    if not (_is_number(base) and _is_number(cur)):
        return MetricCheck(metric, base if _is_number(base) else None, cur if _is_number(cur) else None,
                           None, tolerance=tolerance, note="not measured")
    check = MetricCheck(metric, float(base), float(cur), float(cur - base), tolerance=tolerance, note="deterministic")
    if check.delta > tolerance.allowed(check.baseline):
        check.status = "regression"
        check.note = ""
    return check


def _regression_text(check: MetricCheck) -> str:
    unit = " points" if check.metric == "score" else ""
    stats = []
    if check.low is not None and check.high is not None and not math.isnan(check.low):
        stats.append(f"95% CI {_fmt_delta(check.metric, check.low)} to {_fmt_delta(check.metric, check.high)}")
    if check.p is not None and not math.isnan(check.p):
        stats.append(f"paired t-test p={_fmt_p(check.p)}")
    if check.n:
        stats.append(f"n={check.n}")
    if check.note:
        stats.append(check.note)
    return (f"{check.metric} baseline {_fmt_value(check.metric, check.baseline)}, current "
            f"{_fmt_value(check.metric, check.current)}, difference {_fmt_delta(check.metric, check.delta)}{unit}"
            f"{_relative(check)}"
            + (f" ({'; '.join(stats)})" if stats else "")
            + f", beyond the tolerance {check.tolerance}")


def compare_record(record: dict, entry: dict | None, tolerances: Tolerances, *, seed: int = 0) -> Verdict:
    """Compare one finished item with its baseline entry (None: the item is new)."""
    key = str(record.get("key"))
    current_score = record.get("score") if is_scored(record) else None
    if entry is None:
        return Verdict(key, "new", [MetricCheck("score", None, current_score, None)],
                       message=f"{key}: new item, not in the baseline (score {_fmt_value('score', current_score)})")
    reasons = []
    if current_score is None:
        reasons.append(f"no score in this run (status {record.get('status') or 'unknown'})")
    else:
        reasons.extend(_settings_mismatch(record, entry))
    if reasons:
        return Verdict(key, "mismatch", [MetricCheck("score", float(entry["score"]), current_score, None)], reasons,
                       message=f"{key}: not compared with the baseline: " + "; ".join(reasons))
    checks = [_check_score(record, entry, tolerances.get("score"), seed)]
    checks += _fidelity_checks(record, entry, seed)
    for tolerance in tolerances:
        if tolerance.metric == "latency":
            checks.append(_check_latency(record, entry, tolerance, seed))
        elif tolerance.metric in ("kv_bytes", "peak_bytes"):
            checks.append(_check_memory(tolerance.metric, record, entry, tolerance))
    regressions = [c for c in checks if c.status == "regression"]
    if regressions:
        message = f"{key}: regression against the baseline: " + "; ".join(_regression_text(c) for c in regressions)
        return Verdict(key, "regression", checks, message=message)
    score = checks[0]
    status = "improved" if score.status == "improved" else "ok"
    message = (f"{key}: {status}: score baseline {_fmt_value('score', score.baseline)}, current "
               f"{_fmt_value('score', score.current)}, difference {_fmt_delta('score', score.delta)} "
               f"(95% CI {_fmt_interval('score', score.low, score.high)}, paired t-test p={_fmt_p(score.p)})")
    return Verdict(key, status, checks, message=message)


# -- reporting ------------------------------------------------------------------------------------


def comparison_table(verdicts: Sequence[Verdict], tablefmt: str = "simple") -> str:
    """The comparison table for the terminal summary and ``kvbench compare``."""
    rows = [row for verdict in verdicts for row in verdict.rows]
    return tabulate(rows, headers=TABLE_HEADERS, tablefmt=tablefmt, disable_numparse=True)


def comparison_summary(verdicts: Sequence[Verdict], unrun: Sequence[str] = ()) -> str:
    """Counts per verdict, then what needs attention: mismatches (with reasons) and unrun entries."""
    counts = {status: sum(v.status == status for v in verdicts) for status in STATUSES}
    parts = [f"{counts[s]} {s}" for s in STATUSES if counts[s]]
    if unrun:
        parts.append(f"{len(unrun)} baseline entr{'y' if len(unrun) == 1 else 'ies'} not run")
    lines = ["kvbench compare: " + (", ".join(parts) or "nothing compared")]
    lines += [f"  mismatch {v.key}: {'; '.join(v.reasons)}" for v in verdicts if v.status == "mismatch"]
    lines += [f"  not run: {key}" for key in unrun]
    return "\n".join(lines)


def environment_differences(baseline_env: dict, current_env: dict) -> list[str]:
    """What changed in the environment since the baseline: context for reading a verdict."""
    notes = []
    for name in ("git_commit", "host", "platform", "python"):
        old, new = baseline_env.get(name), current_env.get(name)
        if old is not None and new is not None and old != new:
            notes.append(f"{name}: {old} -> {new}")
    old_versions = baseline_env.get("versions") or {}
    new_versions = current_env.get("versions") or {}
    for package in sorted(set(old_versions) & set(new_versions)):
        if old_versions[package] != new_versions[package]:
            notes.append(f"{package}: {old_versions[package]} -> {new_versions[package]}")
    return notes
