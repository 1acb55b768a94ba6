"""Runs read back (results/run/directories.py) as the rows of the query tables (query/columns.py).

Every value comes from the typed record and the run's state as the other commands read them: a crashed,
unfinished or damaged run is a row with its state, a run nothing can be read from is a row saying why, and
no reader of its own parses a file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from pathlib import Path

from pytest_kvbench.results.record import Record, is_number
from pytest_kvbench.results.run.directories import Run, RunError, load_run, run_dirs
from pytest_kvbench.results.run.state import RunState
from pytest_kvbench.results.views.table_model import sample_interval

UNREADABLE = "unreadable"


def state_word(state: RunState) -> str:
    """One word for ``WHERE state = ...``: complete, incomplete, started, damaged (RunState.label() says more)."""
    if state.damaged:
        return "damaged"
    if state.complete:
        return "complete"
    if not state.has_run_file and not state.has_records_file:
        return "started"
    return "incomplete"


def read_runs(results_dir: str | os.PathLike) -> Iterator[Run | tuple[Path, str]]:
    """Every run under the results directory, oldest name first; (path, why) for one that cannot be read."""
    for path in run_dirs(results_dir):
        try:
            yield load_run(path, results_dir)
        except RunError as exc:
            yield path, str(exc)


def _number(value: object) -> float | None:
    return float(value) if is_number(value) else None


def _integer(value: object) -> int | None:
    return int(value) if is_number(value) and float(value).is_integer() else None


def _text(value: object) -> str | None:
    return None if value is None else str(value)


def _time(stamp: object) -> datetime | None:
    if isinstance(stamp, str):
        try:
            moment = datetime.fromisoformat(stamp)
        except ValueError:
            return None
        return (moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)).astimezone(timezone.utc)
    return None


def device_of(record: Record) -> str | None:
    """The item's device in one phrase: the GPU or CPU model, with the driver or thread count."""
    device = record.device
    if not device.name:
        return None
    detail = f"driver {device.driver}" if device.driver else f"{device.threads} threads" if device.threads else None
    return device.name + (f" ({detail})" if detail else "")


def run_row(run: Run) -> dict:
    env = run.environment
    versions = env.get("versions") if isinstance(env.get("versions"), dict) else None
    start = _time(run.info.get("start"))
    if start is None and run.started is not None:  # no run.json: the time in the run id, local time
        start = run.started.astimezone(timezone.utc)
    devices = list(dict.fromkeys(d for d in map(device_of, run.records) if d))
    return {
        "run_id": run.run_id, "start": start, "end": _time(run.info.get("end")),
        "duration_s": _number(run.info.get("duration_s")) if run.info.get("end") else None,
        "commit": _text(run.commit), "dirty": run.dirty if isinstance(run.dirty, bool) else None,
        "command": _text(run.command), "versions": json.dumps(versions, sort_keys=True) if versions else None,
        "device": "; ".join(devices) or None, "state": state_word(run.state), "state_detail": run.state.label(),
        "items": len(run.records), "unfinished": len(run.state.unfinished_items), "path": str(run.path),
    }


def unreadable_row(path: Path, why: str) -> dict:
    """A run directory nothing could be read from: listed, with why, and no items."""
    return {"run_id": path.name, "state": UNREADABLE, "state_detail": why, "items": 0, "path": str(path)}


def score_interval(record: Record) -> tuple[float | None, float | None]:
    """The 95% bootstrap interval of the item's score over its samples (x 100), as the tables print it."""
    return sample_interval(record.sample_scores) or (None, None)


def _stops(record: Record, reason: str) -> int | None:
    stops = [s.get("stop") for s in record.samples]
    return sum(stop == reason for stop in stops) if any(stop is not None for stop in stops) else None


def item_row(record: Record, run_id: str) -> dict:
    low, high = score_interval(record)
    latency, memory, fidelity = record.latency, record.memory, record.fidelity
    return {
        "run_id": run_id, "key": record.key, "item_id": record.item_id, "status": record.status,
        "message": record.message, "crashed": record.crashed, "model": record.model.name,
        "method": record.method.name, "params": json.dumps(record.method.params or {}, sort_keys=True, default=str),
        "budget": record.budget.spec, "budget_kind": record.budget.kind, "budget_value": _number(record.budget.value),
        "protocol": record.protocol, "task": record.task.name, "suite": record.task.suite,
        "context_length": _integer(record.task.context_length), "seed": _integer(record.seed),
        "metric": record.metric, "score": _number(record.score), "score_low": low, "score_high": high,
        "n_samples": _integer(record.n_samples), "kl": _number(fidelity.kl), "agreement": _number(fidelity.agreement),
        "decode_kl": _number(fidelity.decode_kl), "prefill_ms": _number(latency.prefill_ms),
        "decode_tokens_per_s": _number(latency.decode_tokens_per_s),
        "decode_tokens_per_s_alone": _number(latency.decode_tokens_per_s_alone), "total_s": _number(latency.total_s),
        "peak_bytes": _integer(memory.peak_bytes), "memory_kind": memory.kind,
        "peak_reserved_bytes": _integer(memory.peak_reserved_bytes),
        "kv_bytes_before": _number(memory.kv_bytes_before), "kv_bytes_after": _number(memory.kv_bytes_after),
        "compression_ratio": _number(memory.compression_ratio), "energy_j": _number(record.energy_j),
        "stops_eos": _stops(record, "eos"), "stops_max_new_tokens": _stops(record, "max_new_tokens"),
        "device": device_of(record),
    }


def sample_rows(record: Record, run_id: str) -> Iterator[dict]:
    for sample in record.samples:
        yield {
            "run_id": run_id, "key": record.key, "sample_id": _text(sample.get("id")),
            "score": _number(sample.get("score")), "prompt_tokens": _integer(sample.get("prompt_tokens")),
            "kept_tokens": _number(sample.get("kept_tokens")), "prefill_ms": _number(sample.get("prefill_ms")),
            "decode_ms": _number(sample.get("decode_ms")), "new_tokens": _integer(sample.get("new_tokens")),
            "kv_bytes_after": _number(sample.get("kv_bytes_after")), "kl": _number(sample.get("kl")),
            "agreement": _number(sample.get("agreement")), "decode_kl": _number(sample.get("decode_kl")),
            "stop": _text(sample.get("stop")), "prediction": _text(sample.get("prediction")),
        }


def table_rows(runs: Iterable[Run | tuple[Path, str]]) -> dict[str, list[dict]]:
    """The rows of the three tables for these runs (runs, items, samples)."""
    tables: dict[str, list[dict]] = {"runs": [], "items": [], "samples": []}
    for run in runs:
        if isinstance(run, tuple):
            tables["runs"].append(unreadable_row(*run))
            continue
        tables["runs"].append(run_row(run))
        for record in run.records:
            tables["items"].append(item_row(record, run.run_id))
            tables["samples"].extend(sample_rows(record, run.run_id))
    return tables
