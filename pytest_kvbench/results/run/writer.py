"""The one writer of a run directory's finished form: item folders, run.json and both RESULTS.md copies.

The session (at the end of a run, and of a resumed one) and ``kvbench merge`` both end a run
here, so a run directory has one layout whoever made it (DEVELOPERS.md, *Run directory*):
``{method}_{model}_{budget}/{task}[_{ctx}][_seed{N}]/`` with ``predictions.jsonl`` and
``metrics.json`` per item, ``run.json`` with every record, and the run's RESULTS.md. Folder
names come from the record's labels (record.py), so methods ``my-a`` and ``my-b`` get two; they
are reduced to safe characters and never ``..``, so a crafted record cannot write outside its run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

from pytest_kvbench import atomic_files
from pytest_kvbench.cases import model_label
from pytest_kvbench.results.run import storage
from pytest_kvbench.results.record import Record
from pytest_kvbench.record_key import DEFAULT_PROTOCOL
from pytest_kvbench.results.run.directories import run_dirs
from pytest_kvbench.results.views.tables import Columns, results_markdown, shared_results_markdown, zero_scores

SCHEMA = 1
RESULTS_FILE = storage.RESULTS_FILE
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


def item_dir(run_dir: Path, record: Record, show_seed: bool) -> Path:
    """The folder of one item's predictions and metrics, always two levels inside ``run_dir``."""
    label = record.labels
    task = record.task
    config = path_safe(f"{label.method}_{model_label(label.model)}_{label.budget}")
    task_name = str(task.name) + (f"_{task.context_length}" if task.context_length else "")
    if show_seed:
        task_name += f"_seed{record.seed}"
    if label.protocol != DEFAULT_PROTOCOL:
        task_name += f"_{label.protocol}"
    folder = run_dir / config / path_safe(task_name)
    if folder.resolve().parent.parent != Path(run_dir).resolve():
        raise ItemPathError(f"record {record.key!r}: its item folder {folder} would lie outside the run {run_dir}")
    return folder


def write_item_files(run_dir: Path, record: Record, show_seed: bool) -> None:
    """predictions.jsonl (every sample) and metrics.json (the item's figures) of one item."""
    if not record.samples:
        return
    folder = item_dir(run_dir, record, show_seed)
    storage.write_jsonl(folder / "predictions.jsonl", record.samples)
    written = record.to_json()
    metrics = {k: written.get(k) for k in _METRICS_FIELDS}
    metrics |= {"method": written["method"], "budget": written["budget"], "model": record.model.name,
                "task": written["task"], "seed": record.seed, "protocol": record.protocol}
    atomic_files.atomic_write_json(folder / "metrics.json", metrics)


def summarize(records: list[Record]) -> dict:
    """Counts per status, the zero scores and the mean score: the head of run.json."""
    by_status: dict[str, int] = {}
    for r in records:
        by_status[r.status or "unknown"] = by_status.get(r.status or "unknown", 0) + 1
    scored = [r for r in records if r.score is not None]
    return {
        "items": len(records),
        "by_status": by_status,
        "zero_scores": zero_scores(scored),
        "mean_score": round(sum(r.score for r in scored) / len(scored), 2) if scored else None,
        "total_item_s": round(sum(r.latency.total_s or 0 for r in records), 3),
    }


def run_document(*, run_id: str, start: str | None, start_ts: float | None, end: str | None, duration_s: float,
                 complete: bool, resumed: bool, grid: dict, environment: dict, records: list[Record],
                 **extra) -> dict:
    """The content of run.json; ``extra`` adds fields (``merged_from`` for a merged run)."""
    return {"schema": SCHEMA, "run_id": run_id, "start": start, "start_ts": start_ts, "end": end,
            "duration_s": duration_s, "complete": complete, "resumed": resumed, "grid": grid,
            "environment": environment, **extra, "summary": summarize(records),
            "records": [r.to_json() for r in records]}


def start_of_run_files(run_dir: Path, run: dict, settings: dict) -> list[tuple[str, Path, Callable[[], object]]]:
    """What a run writes when it starts (its items known, its directory locked): settings.json (when not there
    yet) and a first run.json (``run``, without ``end``), so a run killed with -9 still says what it was."""
    return [(storage.SETTINGS_FILE, run_dir / storage.SETTINGS_FILE,
             partial(storage.write_settings, run_dir, settings)),
            (storage.RUN_FILE, run_dir / storage.RUN_FILE,
             partial(atomic_files.atomic_write_json, run_dir / storage.RUN_FILE, run))]


def end_of_run_files(run_dir: Path, run: dict, records: list[Record], *, settings: dict | None = None,
                     results_dir: Path | None = None, columns: Columns | None = None,
                     ) -> list[tuple[str, Path, Callable[[], object]]]:
    """Every file ending a run writes, in order: (what, path, the function that writes it). ``settings``
    (the session's grid): settings.json first, when it is not there yet (a run stopped before its first record
    can then be resumed); then each item folder, run.json (``run``, from run_document) and the run's
    RESULTS.md; with ``results_dir`` (the session, not a merge), the results directory's RESULTS.md: the
    run's, saying which run it shows and where the directory's other runs are. The caller writes them one by
    one, so that one failure (a full disk) leaves the others written (wiring/final_writes.py). Item folders name the seed when the records hold several seeds.
    """
    show_seed = len({r.seed for r in records}) > 1
    markdown = results_markdown(run, records, columns)  # columns: a user's own (the session's hook)
    files: list[tuple[str, Path, Callable[[], object]]] = []
    if settings is not None:
        files.append((storage.SETTINGS_FILE, run_dir / storage.SETTINGS_FILE,
                      partial(storage.write_settings, run_dir, settings)))
    files += [("item folder", item_dir(run_dir, record, show_seed),
               partial(write_item_files, run_dir, record, show_seed)) for record in records if record.samples]
    files.append((storage.RUN_FILE, run_dir / storage.RUN_FILE,
                  partial(atomic_files.atomic_write_json, run_dir / storage.RUN_FILE, run)))
    files.append((f"the run's {RESULTS_FILE}", run_dir / RESULTS_FILE,
                  partial(atomic_files.atomic_write_text, run_dir / RESULTS_FILE, markdown)))
    if results_dir is not None:
        table = results_dir / RESULTS_FILE
        shared = shared_results_markdown(markdown, run["run_id"], other_runs(results_dir, run["run_id"]),
                                         str(results_dir))
        files.append((f"{RESULTS_FILE} of the results directory", table,
                      partial(atomic_files.atomic_write_text, table, shared)))
    return files


def other_runs(results_dir: Path, run_id: str) -> list[str]:
    """The other runs of the results directory, oldest first (the names hold their start time)."""
    return sorted((p.name for p in run_dirs(results_dir) if p.name != run_id),
                  key=lambda name: (name.rsplit("_", 2)[-2:], name))


def write_run(run_dir: Path, run: dict, records: list[Record]) -> None:
    """Item folders, run.json and the run's RESULTS.md, all atomic (``kvbench merge``'s staging directory)."""
    for _, _, write in end_of_run_files(run_dir, run, records):
        write()
