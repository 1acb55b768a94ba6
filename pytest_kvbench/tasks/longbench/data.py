"""Where LongBench records come from: packaged fixtures, a local directory, or the hub.

* ``data_dir="fixtures"`` (or the packaged ``FIXTURE_DIR``): small files written by this project
  in the official record format, so tests and the embedded default run with no download.
* ``data_dir=<path>``: ``<path>/{task}.jsonl`` (or ``<path>/data/{task}.jsonl``, the layout of
  the official data.zip), one official record per line.
* ``data_dir=None``: the hub dataset THUDM/LongBench through ``datasets`` (cached by it). The
  dataset is script-based, which recent ``datasets`` releases refuse to run, so when that fails
  the official ``data.zip`` is fetched from the same hub repository instead. Offline with
  nothing cached, or without network, the task is unavailable (skipped) with a message
  saying how to get the data.

Every record is validated; a malformed one is a DataError naming the file and line.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..errors import DataError, TaskUnavailable
from ..sources import DATA_ROOT, is_fixture_dir, parse_line, read_jsonl as _read_jsonl, require_fields, take

FIXTURE_DIR = DATA_ROOT / "longbench"
HUB_REPO = "THUDM/LongBench"

_HOW_TO_GET = (
    "get the data with `python -c \"from datasets import load_dataset; "
    "load_dataset('THUDM/LongBench', '{task}', split='test')\"` while online (it is cached), "
    "or unzip https://huggingface.co/datasets/THUDM/LongBench/resolve/main/data.zip and pass "
    "data_dir=<folder with {task}.jsonl>; data_dir='fixtures' runs the small packaged samples"
)


def fixture_tasks() -> list[str]:
    return sorted(path.stem for path in FIXTURE_DIR.glob("*.jsonl"))


def load_records(task: str, data_dir=None, n: int | None = None) -> list[tuple[str, dict]]:
    """The first ``n`` records (all when None) of a task as ``(source, record)`` pairs, in file order.

    ``source`` names where the record came from ("file:line" or "hub:task:row") for ids and errors.
    """
    if is_fixture_dir(data_dir):
        path = FIXTURE_DIR / f"{task}.jsonl"
        if not path.is_file():
            raise TaskUnavailable(
                f"no packaged fixture for LongBench task {task!r} (fixtures exist for: "
                f"{', '.join(fixture_tasks())}); pass a data_dir with the real data. "
                + _HOW_TO_GET.format(task=task)
            )
        return list(take(read_jsonl(path), n))
    if data_dir is not None:
        return list(take(read_jsonl(local_file(task, Path(data_dir))), n))
    return list(take(_hub_records(task), n))


def local_file(task: str, data_dir: Path) -> Path:
    for candidate in (data_dir / f"{task}.jsonl", data_dir / "data" / f"{task}.jsonl"):
        if candidate.is_file():
            return candidate
    raise TaskUnavailable(f"{data_dir / f'{task}.jsonl'} does not exist; " + _HOW_TO_GET.format(task=task))


def read_jsonl(path: Path) -> Iterator[tuple[str, dict]]:
    return _read_jsonl(path, validate_record)


REQUIRED_FIELDS: dict[str, type | tuple[type, ...]] = {
    "input": str,
    "context": str,
    "answers": list,
    "length": int,
}


def validate_record(record: Any, where: str) -> dict:
    """Check one record against the official format; returns it unchanged."""
    require_fields(record, where, REQUIRED_FIELDS)
    if not record["answers"] or not all(isinstance(answer, str) for answer in record["answers"]):
        raise DataError(f"{where}: field 'answers' must be a non-empty list of strings")
    classes = record.get("all_classes")
    if classes is not None and not (isinstance(classes, list) and all(isinstance(c, str) for c in classes)):
        raise DataError(f"{where}: field 'all_classes' must be null or a list of strings")
    return record


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _hub_records(task: str) -> Iterator[tuple[str, dict]]:
    try:
        rows = _load_with_datasets(task)
    except TaskUnavailable as datasets_failure:
        try:
            path = _download_data_zip()
        except TaskUnavailable as zip_failure:
            raise TaskUnavailable(
                f"LongBench task {task!r} is not available: {datasets_failure}; {zip_failure}. "
                + _HOW_TO_GET.format(task=task)
            ) from None
        yield from _read_zip_member(path, task)
        return
    for row_number, row in enumerate(rows):
        where = f"hub:{HUB_REPO}/{task}:{row_number}"
        yield where, validate_record(dict(row), where)


def _load_with_datasets(task: str):
    try:
        # lazy for startup time: datasets (pyarrow, pandas)
        from datasets import load_dataset

        return load_dataset(HUB_REPO, task, split="test")
    except Exception as error:  # offline, not cached, scripts unsupported, network errors
        raise TaskUnavailable(f"datasets could not load {HUB_REPO}/{task} ({type(error).__name__}: {error})") from None


def _download_data_zip() -> Path:
    try:
        # lazy for startup time: huggingface_hub, only when data comes from the hub
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(HUB_REPO, "data.zip", repo_type="dataset", local_files_only=_hub_offline()))
    except Exception as error:
        raise TaskUnavailable(f"data.zip could not be fetched ({type(error).__name__}: {error})") from None


def _read_zip_member(path: Path, task: str) -> Iterator[tuple[str, dict]]:
    member = f"data/{task}.jsonl"
    with zipfile.ZipFile(path) as archive:
        if member not in archive.namelist():
            raise TaskUnavailable(f"{path} has no {member}; " + _HOW_TO_GET.format(task=task))
        with archive.open(member) as handle:
            for line_number, raw in enumerate(handle, start=1):
                if not raw.strip():
                    continue
                where = f"{path}!{member}:{line_number}"
                yield where, validate_record(parse_line(raw, where), where)
