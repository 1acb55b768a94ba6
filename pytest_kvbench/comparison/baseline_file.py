"""The baseline file (``--kvbench-save`` / ``--kvbench-compare``): what it keeps of a record, writing, strict reading.

A baseline keeps, per comparison key, what the gate needs: the settings that must match, the
score, the per-sample scores, fidelity figures (kl, agreement, decode_kl) and timings it pairs, and
the cost figures. Reading validates every
entry, so a malformed file is a one-line ``BaselineError`` naming the file and the entry.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from pytest_kvbench import user_paths
from pytest_kvbench.atomic_files import atomic_write_json
from pytest_kvbench.input_values import shown
from pytest_kvbench.results.record import (BudgetInfo, Device, Latency, Memory, MethodInfo, Record, TaskInfo, is_number,
                                            is_whole)
from pytest_kvbench.results.record.fingerprint import SAMPLE_DIGESTS
from pytest_kvbench.results.record.serializer import OMITTED_AT_DEFAULT, RecordShapeError, from_json, to_json
from pytest_kvbench.record_key import DEFAULT_PROTOCOL
from pytest_kvbench.results.run.storage import read_json

FORMAT = "kvbench-baseline"
VERSION = 1


class BaselineError(ValueError):
    """A baseline or tolerance that cannot be used; one line, naming the file and what is wrong."""


@dataclass(frozen=True, kw_only=True)
class BaselineModel:
    """What a baseline keeps of the model: the settings a comparison must match."""

    name: str | None = None
    dtype: str | None = None
    attn_implementation: str | None = None
    gguf_sha256: str | None = field(default=None, metadata=OMITTED_AT_DEFAULT)  # GGUF-derived weights only
    extra: dict = field(default_factory=dict)


# prompt_tokens: with the multi-turn protocol it counts the history the model saw (earlier questions and answers)
_SAMPLE_FIELDS = ("id", "score", "prefill_ms", "decode_ms", "kl", "agreement", "decode_kl", "prompt_tokens",
                  *SAMPLE_DIGESTS)
FIDELITY_FIELDS = ("kl", "agreement", "decode_kl")  # per-sample distance to the full cache, gated two-sided


@dataclass(frozen=True, kw_only=True)
class BaselineEntry:
    """The part of a record a baseline needs: identity, settings, score, per-sample data, cost. Its parts
    are the record's own, so verdicts.py reads an entry and a record alike."""

    key: str
    item_id: str | None = None
    model: BaselineModel = field(default_factory=BaselineModel)
    method: MethodInfo | None = None
    budget: BudgetInfo | None = None
    protocol: str | None = None
    max_prompt_tokens: int | None = None
    seed: int | None = None
    task: TaskInfo | None = None
    metric: str | None = None
    benchmark: dict | None = field(default=None, metadata=OMITTED_AT_DEFAULT)  # None: saved before fingerprints
    score: float
    n_samples: int | None = None
    samples: list[dict]
    latency: Latency = field(default_factory=Latency)
    memory: Memory = field(default_factory=Memory)
    device: Device = field(default_factory=Device)
    extra: dict = field(default_factory=dict)

    @classmethod
    def of(cls, record: Record) -> BaselineEntry:
        model = record.model
        return cls(key=record.key, item_id=record.item_id,
                   model=BaselineModel(name=model.name, dtype=model.dtype, attn_implementation=model.attn_implementation,
                                       gguf_sha256=model.gguf_sha256),
                   method=record.method, budget=record.budget, protocol=record.protocol,
                   max_prompt_tokens=record.max_prompt_tokens, seed=record.seed, task=record.task, metric=record.metric,
                   benchmark=record.benchmark, score=record.score, n_samples=record.n_samples,
                   samples=[{k: s.get(k) for k in _SAMPLE_FIELDS} for s in record.samples],
                   latency=record.latency, memory=record.memory, device=record.device)

    def to_json(self) -> dict:
        return to_json(self)


# -- the baseline -----------------------------------------------------------------------------


@dataclass
class Baseline:
    """Baseline entries by comparison key, with the environment they were measured in."""

    entries: dict[str, BaselineEntry]
    environment: dict = field(default_factory=dict)
    source: str = ""
    created: str | None = None
    run_id: str | None = None

    @property
    def has_fidelity(self) -> bool:
        """Whether any entry keeps per-sample fidelity figures (baselines saved before they were kept have none:
        the gate then judges the score alone, and says so once)."""
        return any(is_number(sample.get(name)) for entry in self.entries.values() for sample in entry.samples
                   for name in FIDELITY_FIELDS)

    def entry(self, record: Record) -> BaselineEntry | None:
        return self.entries.get(record.key)

    def unrun(self, keys_seen: Iterable[str]) -> list[str]:
        """Baseline entries that this run did not produce (listed, not failed)."""
        seen = set(keys_seen)
        return sorted(k for k in self.entries if k not in seen)

    @classmethod
    def from_records(cls, records: Iterable[Record], environment: dict | None = None, source: str = "") -> Baseline:
        """An in-memory baseline from a run's records (``kvbench compare A B`` uses run A)."""
        entries: dict[str, BaselineEntry] = {}
        run_ids = set()
        for record in records:
            if not record.is_scored:
                continue
            if record.key in entries:
                raise BaselineError(f"{source or 'records'}: item {record.key} appears twice")
            entries[record.key] = BaselineEntry.of(record)
            run_ids.add(record.run_id)
        return cls(entries=entries, environment=dict(environment or {}), source=source,
                   run_id=next(iter(run_ids)) if len(run_ids) == 1 else None)

    def to_json(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "created": self.created, "run_id": self.run_id,
                "environment": self.environment, "entries": {k: e.to_json() for k, e in self.entries.items()}}


def check_save_target(path: str | os.PathLike, force: bool) -> None:
    """Refuse a --kvbench-save target at configure time, before an hour of benchmarking is spent."""
    try:
        target, exists = user_paths.writable_file(path, "cannot save baseline", make_parents=False)
    except user_paths.PathError as exc:
        raise BaselineError(str(exc)) from None
    if exists and not force:
        raise BaselineError(f"baseline {user_paths.shown(target)} already exists; pass --kvbench-save-force to replace it")


def write_baseline(path: str | os.PathLike, records: list[Record], environment: dict, force: bool) -> None:
    """Save the run's scored items as a baseline; refuses to replace a file unless ``force``."""
    target = Path(path)
    check_save_target(target, force)
    scored = [r for r in records if r.is_scored]
    if not scored:
        raise BaselineError(f"nothing to save in baseline {target}: no item produced a score")
    baseline = Baseline.from_records(scored, environment, source=str(target))
    baseline.created = datetime.now().astimezone().isoformat(timespec="seconds")
    try:
        atomic_write_json(target, baseline.to_json(), make_parents=False)
    except OSError as exc:
        raise BaselineError(f"cannot write baseline {target}: {exc.strerror or exc}") from None


def _read_entry(path: Path, key: object, entry: object) -> BaselineEntry:
    where = f"{path}: entry {key!r}"
    if not isinstance(entry, dict):
        raise BaselineError(f"{where} is not an object")
    if entry.get("key", key) != key:
        raise BaselineError(f"{where} has a different 'key' inside ({entry.get('key')!r})")
    if not is_number(entry.get("score")):
        raise BaselineError(f"{where} has no numeric 'score'")
    samples = entry.get("samples")
    if not isinstance(samples, list):
        raise BaselineError(f"{where} has no 'samples' list")
    if not samples:
        raise BaselineError(f"{where} has no samples: a run's samples could never be paired with it")
    seen: set = set()
    for number, sample in enumerate(samples, start=1):
        if not isinstance(sample, dict) or not isinstance(sample.get("id"), (str, int)) or isinstance(sample.get("id"), bool):
            raise BaselineError(f"{where}: sample {number} has no 'id'")
        if str(sample["id"]) in seen:
            raise BaselineError(f"{where}: sample {sample['id']!r} appears twice (samples pair by id)")
        seen.add(str(sample["id"]))
        if not is_number(sample.get("score")):
            raise BaselineError(f"{where}: sample {sample['id']!r} has no numeric 'score'")
        for name in FIDELITY_FIELDS:  # Infinity or NaN would drop the sample from that check without a word
            if sample.get(name) is not None and not is_number(sample[name]):
                raise BaselineError(f"{where}: sample {sample['id']!r} has {name} {shown(sample[name])}; it must be a "
                                    f"finite number or null")
        tokens = sample.get("prompt_tokens")  # held exactly for the reference (benchmark_changes: its history)
        if tokens is not None and not (is_whole(tokens) and tokens >= 0):
            raise BaselineError(f"{where}: sample {sample['id']!r} has prompt_tokens {shown(tokens)}; it must be a "
                                f"whole number >= 0 or null")
    n_samples = entry.get("n_samples")
    if n_samples is not None and not (is_whole(n_samples) and n_samples >= 1):
        raise BaselineError(f"{where}: 'n_samples' must be a positive integer, got {shown(n_samples)}")
    for name in ("method", "latency", "memory", "task", "benchmark"):
        if entry.get(name) is not None and not isinstance(entry.get(name), dict):
            raise BaselineError(f"{where}: {name!r} must be an object")
    try:
        return from_json(BaselineEntry, {"key": key} | entry, "entry")
    except RecordShapeError as exc:
        raise BaselineError(f"{where}: {exc}") from None


def check_same_protocols(entries: Iterable[BaselineEntry], records: Iterable[Record], baseline_name: str,
                         run_id: str) -> None:
    """BaselineError when a run and its reference ran different protocols: their scores measure
    different things (one question per prefill vs one compressed context for many), so no verdict."""
    def protocols(items: Iterable[BaselineEntry | Record]) -> list[str]:
        return sorted({item.protocol or DEFAULT_PROTOCOL for item in items})

    theirs, ours = protocols(entries), protocols(r for r in records if r.is_scored)
    if ours and theirs != ours:
        raise BaselineError(f"cannot compare across protocols: {baseline_name} ran {', '.join(theirs)}, "
                            f"run {run_id} ran {', '.join(ours)} (settings mismatch)")


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
    data = read_json(source, f"baseline {source}", BaselineError)
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
    typed = {key: _read_entry(source, key, entry) for key, entry in entries.items()}
    environment = data.get("environment")
    return Baseline(entries=typed, environment=environment if isinstance(environment, dict) else {},
                    source=str(source), created=data.get("created"), run_id=data.get("run_id"))
