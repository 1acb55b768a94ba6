"""The per-item files of a run directory: ``{method}_{model}_{budget}/{task}/`` with
``predictions.jsonl`` and ``metrics.json``.

One definition serves the end of a pytest run (session.py) and ``kvbench merge`` (runs.py), so
both lay a run out alike. The folder names come from record fields, and records can be edited
or crafted (a budget or task named ``..``), so every name is reduced to safe characters, a name
made only of dots is renamed, and a folder that would still land outside the run directory is
refused: these writers never touch anything but their own run.
"""

from __future__ import annotations

from pathlib import Path

from pytest_kvbench.results import storage
from pytest_kvbench.wiring.grid import model_label, path_safe
from pytest_kvbench.user_paths import inside

METRIC_FIELDS = ("item_id", "key", "metric", "score", "aggregate", "n_samples",
                 "latency", "memory", "fidelity", "energy_j", "status")


class ItemPathError(ValueError):
    """A record whose fields would place its files outside the run directory."""


def _name(text: str) -> str:
    """A single safe path component: never empty, never ``.`` or ``..``."""
    name = path_safe(text)
    return name if name.strip(".") else name.replace(".", "_")


def item_dir(run_dir: Path, record: dict, show_seed: bool) -> Path:
    """The folder of one item's files inside ``run_dir``."""
    task = record["task"]
    method = (record.get("item_id") or record["method"]["name"]).split("-")[0]
    config = _name(f"{method}_{model_label(record['model']['name'])}_{record['budget']['spec']}")
    task_name = str(task["name"]) + (f"_{task['context_length']}" if task.get("context_length") else "")
    if show_seed:
        task_name += f"_seed{record.get('seed')}"
    folder = run_dir / config / _name(task_name)
    if not inside(folder, run_dir) or folder.parent.parent.resolve() != Path(run_dir).resolve():
        raise ItemPathError(f"record {record.get('key')!r}: its item folder {folder} would lie outside the run {run_dir}")
    return folder


def write_item_files(run_dir: Path, record: dict, show_seed: bool) -> None:
    """predictions.jsonl and metrics.json of one scored item (nothing for an item without samples)."""
    if not record.get("samples"):
        return
    folder = item_dir(run_dir, record, show_seed)
    storage.write_jsonl(folder / "predictions.jsonl", record["samples"])
    metrics = {k: record.get(k) for k in METRIC_FIELDS}
    metrics |= {"method": record["method"], "budget": record["budget"], "model": record["model"].get("name"),
                "task": record["task"], "seed": record.get("seed"), "protocol": record.get("protocol")}
    storage.atomic_write_json(folder / "metrics.json", metrics)
