"""The baseline file (``--kvbench-save`` / ``--kvbench-compare``): what it keeps of a record, writing, strict reading.

A baseline keeps, per comparison key, what the gate needs: the settings that must match, the
score, the per-sample scores and timings it pairs, and the cost figures. Reading validates every
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
from pytest_kvbench.cases import DEFAULT_PROTOCOL
from pytest_kvbench.results.record import is_number, is_scored
from pytest_kvbench.results.storage import read_json

FORMAT = "kvbench-baseline"
VERSION = 1


class BaselineError(ValueError):
    """A baseline or tolerance that cannot be used; one line, naming the file and what is wrong."""


def baseline_entry(record: dict) -> dict:
    """The part of a record a baseline needs: identity, settings, score, per-sample data, cost."""
    model = record.get("model") or {}
    gguf = model.get("gguf") if isinstance(model.get("gguf"), dict) else {}
    return {
        "key": record["key"],
        "item_id": record.get("item_id"),
        "model": {k: model.get(k) for k in ("name", "dtype", "attn_implementation") if k in model}
        | ({"gguf_sha256": gguf["sha256"]} if gguf.get("sha256") else {}),
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
    if not is_number(entry.get("score")):
        raise BaselineError(f"{where} has no numeric 'score'")
    samples = entry.get("samples")
    if not isinstance(samples, list):
        raise BaselineError(f"{where} has no 'samples' list")
    for number, sample in enumerate(samples, start=1):
        if not isinstance(sample, dict) or not isinstance(sample.get("id"), (str, int)) or isinstance(sample.get("id"), bool):
            raise BaselineError(f"{where}: sample {number} has no 'id'")
        if not is_number(sample.get("score")):
            raise BaselineError(f"{where}: sample {sample['id']!r} has no numeric 'score'")
    for name in ("method", "latency", "memory", "task"):
        if entry.get(name) is not None and not isinstance(entry.get(name), dict):
            raise BaselineError(f"{where}: {name!r} must be an object")


def check_same_protocols(entries: Iterable[dict], records: Iterable[dict], baseline_name: str, run_id: str) -> None:
    """BaselineError when a run and its reference ran different protocols: their scores measure
    different things (one question per prefill vs one compressed context for many), so no verdict."""
    def protocols(items: Iterable[dict]) -> list[str]:
        return sorted({item.get("protocol") or DEFAULT_PROTOCOL for item in items})

    theirs, ours = protocols(entries), protocols(r for r in records if is_scored(r))
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
    for key, entry in entries.items():
        _check_entry(source, key, entry)
    environment = data.get("environment")
    return Baseline(entries=entries, environment=environment if isinstance(environment, dict) else {},
                    source=str(source), created=data.get("created"), run_id=data.get("run_id"))
