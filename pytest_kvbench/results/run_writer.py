"""The one writer of a run directory's finished form: item folders, run.json and RESULTS.md.

The session (at the end of a run, and of a resumed one) and ``kvbench merge`` both end a run
here, so a run directory has one layout whoever made it (DEVELOPERS.md, *Run directory*):
``{method}_{model}_{budget}/{task}[_{ctx}][_seed{N}]/`` with ``predictions.jsonl`` and
``metrics.json`` per item, ``run.json`` with every record, and the run's RESULTS.md. Folder
names come from the record's labels (record.py), so methods ``my-a`` and ``my-b`` get two; they
are reduced to safe characters and never ``..``, so a crafted record cannot write outside its run.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from pathlib import Path

from pytest_kvbench import atomic_files
from pytest_kvbench.cases import DEFAULT_PROTOCOL, model_label
from pytest_kvbench.results import storage
from pytest_kvbench.results.record import labels
from pytest_kvbench.results.tables import results_markdown, zero_scores

SCHEMA = 1
RESULTS_FILE = "RESULTS.md"
_METRICS_FIELDS = ("item_id", "key", "metric", "score", "aggregate", "n_samples", "latency", "memory", "fidelity",
                   "energy_j", "status", "device")


def iso_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).astimezone().isoformat(timespec="seconds")


class ItemPathError(ValueError):
    """A record whose fields would place its files outside the run directory."""


def path_safe(text: str) -> str:
    """One safe path component: never empty, never ``.`` or ``..`` (records can be edited or crafted)."""
    name = re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_") or "_"
    return name if name.strip(".") else name.replace(".", "_")


def item_dir(run_dir: Path, record: dict, show_seed: bool) -> Path:
    """The folder of one item's predictions and metrics, always two levels inside ``run_dir``."""
    label = labels(record)
    task = record["task"]
    config = path_safe(f"{label.method}_{model_label(label.model)}_{label.budget}")
    task_name = str(task["name"]) + (f"_{task['context_length']}" if task.get("context_length") else "")
    if show_seed:
        task_name += f"_seed{record.get('seed')}"
    if label.protocol != DEFAULT_PROTOCOL:
        task_name += f"_{label.protocol}"
    folder = run_dir / config / path_safe(task_name)
    if folder.resolve().parent.parent != Path(run_dir).resolve():
        raise ItemPathError(f"record {record.get('key')!r}: its item folder {folder} would lie outside the run {run_dir}")
    return folder


def write_item_files(run_dir: Path, record: dict, show_seed: bool) -> None:
    """predictions.jsonl (every sample) and metrics.json (the item's figures) of one item."""
    if not record.get("samples"):
        return
    folder = item_dir(run_dir, record, show_seed)
    storage.write_jsonl(folder / "predictions.jsonl", record["samples"])
    metrics = {k: record.get(k) for k in _METRICS_FIELDS}
    metrics |= {"method": record["method"], "budget": record["budget"], "model": record["model"].get("name"),
                "task": record["task"], "seed": record.get("seed"), "protocol": record.get("protocol")}
    atomic_files.atomic_write_json(folder / "metrics.json", metrics)


def summarize(records: list[dict]) -> dict:
    """Counts per status, the zero scores and the mean score: the head of run.json."""
    by_status: dict[str, int] = {}
    for r in records:
        by_status[r.get("status", "unknown")] = by_status.get(r.get("status", "unknown"), 0) + 1
    scored = [r for r in records if r.get("score") is not None]
    return {
        "items": len(records),
        "by_status": by_status,
        "zero_scores": zero_scores(scored),
        "mean_score": round(sum(r["score"] for r in scored) / len(scored), 2) if scored else None,
        "total_item_s": round(sum((r.get("latency") or {}).get("total_s") or 0 for r in records), 3),
    }


def run_document(*, run_id: str, start: str | None, start_ts: float | None, end: str | None, duration_s: float,
                 complete: bool, resumed: bool, grid: dict, environment: dict, records: list[dict],
                 **extra) -> dict:
    """The content of run.json; ``extra`` adds fields (``merged_from`` for a merged run)."""
    return {"schema": SCHEMA, "run_id": run_id, "start": start, "start_ts": start_ts, "end": end,
            "duration_s": duration_s, "complete": complete, "resumed": resumed, "grid": grid,
            "environment": environment, **extra, "summary": summarize(records), "records": records}


def write_run(run_dir: Path, run: dict) -> str:
    """Item folders, run.json and the run's RESULTS.md, all atomic; returns the RESULTS.md text.

    Item folders name the seed when the records hold several seeds.
    """
    records = run["records"]
    show_seed = len({r.get("seed") for r in records}) > 1
    for record in records:
        write_item_files(run_dir, record, show_seed)
    atomic_files.atomic_write_json(run_dir / storage.RUN_FILE, run)
    markdown = results_markdown(run, records)
    atomic_files.atomic_write_text(run_dir / RESULTS_FILE, markdown)
    return markdown
