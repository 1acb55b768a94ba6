"""Run directories after the fact: find one by id or prefix, read it back, list them.

The harness writes ``results/runs/<run_id>/`` (see DEVELOPERS.md); everything the CLI does starts
here. Reading is strict and explains itself: a missing, unreadable or malformed file is a
``RunError`` whose one-line message names the file and what is wrong, so that ``kvbench`` can
print it and exit 2 instead of showing a traceback. Merging never touches its inputs and
publishes the merged run with a single directory rename, so a failed merge leaves nothing behind.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pytest_kvbench import user_paths
from pytest_kvbench.results.run import storage
from pytest_kvbench.results.record import Record, RecordError
from pytest_kvbench.results.run.state import LOCK_FILES, RunError, RunState, read_run_files

__all__ = ["Run", "RunError", "RunInfo", "RunState", "list_runs", "load_run", "parse_records", "resolve_run_dir", "runs_dir"]

RUNS_SUBDIR = "runs"
LATEST = "latest"
_RUN_ID_TIME = re.compile(r"_(\d{8}_\d{6})$")


@dataclass
class Run:
    """One run directory read back: its ``run.json`` (may be absent for a crashed run) and records."""

    run_id: str
    path: Path
    info: dict
    records: list[Record]
    state: RunState

    @property
    def environment(self) -> dict:
        env = self.info.get("environment")
        return env if isinstance(env, dict) else {}

    @property
    def commit(self) -> str | None:
        return self.environment.get("git_commit")

    @property
    def dirty(self) -> bool | None:
        return self.environment.get("git_dirty")

    @property
    def command(self) -> str | None:
        return self.environment.get("command")

    @property
    def complete(self) -> bool:
        """False for a run without run.json (it crashed or is still running), one marked incomplete, or
        a damaged one (run/state.py)."""
        return self.state.complete

    @property
    def started(self) -> datetime | None:
        return _start_time(self.info, self.run_id, self.path)

    @property
    def scored_records(self) -> list[Record]:
        """Records that carry a numeric score (errored and skipped items have none)."""
        return [r for r in self.records if r.is_scored]


@dataclass(frozen=True)
class RunInfo:
    """One line of ``kvbench list``; ``problem`` is set (and the rest mostly empty) for a corrupt run."""

    run_id: str
    path: Path
    date: datetime | None
    models: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    budgets: tuple[str, ...] = ()
    tasks: tuple[str, ...] = ()
    commit: str | None = None
    n_records: int = 0
    complete: bool = False
    problem: str | None = None
    state: str = ""  # RunState.label(): complete, incomplete: ..., damaged, recovered from ...


# -- finding a run --------------------------------------------------------------------------------


def runs_dir(results_dir: str | os.PathLike) -> Path:
    return Path(results_dir) / RUNS_SUBDIR


def _is_run_dir(path: Path) -> bool:
    """A run's files, or only its lock files: a run killed as it started is listed ("started, no item
    finished"), so that it can be resumed or cleaned (``kvbench clean``)."""
    return any((path / name).is_file() for name in (storage.RUN_FILE, storage.RECORDS_FILE, *LOCK_FILES))


def run_dirs(results_dir: str | os.PathLike) -> list[Path]:
    """Every run directory under ``results_dir/runs`` (hidden ones, like a merge in progress, left out)."""
    return _run_dirs(results_dir)


def _run_dirs(results_dir: str | os.PathLike) -> list[Path]:
    base = runs_dir(results_dir)
    if not base.is_dir():
        return []
    return sorted(p for p in base.iterdir() if p.is_dir() and not p.name.startswith(".") and _is_run_dir(p))


def resolve_run_dir(run_id_or_path: str | os.PathLike, results_dir: str | os.PathLike = "results") -> Path:
    """The directory of a run named by path, exact id, unique id prefix, hex part prefix or ``latest``."""
    text = str(run_id_or_path)
    try:
        user_paths.checked(text, "run")
        user_paths.checked(results_dir, "results directory")
    except user_paths.PathError as exc:
        raise RunError(str(exc)) from None
    as_path = Path(text)
    if as_path.is_file() and as_path.name in (storage.RUN_FILE, storage.RECORDS_FILE):
        as_path = as_path.parent
    if as_path.is_dir() and (os.sep in text or _is_run_dir(as_path) or text in (".", "..")):
        if not _is_run_dir(as_path):
            raise RunError(f"{as_path} is not a run directory (no {storage.RUN_FILE}, {storage.RECORDS_FILE} or "
                           f"{LOCK_FILES[0]})")
        return as_path
    if not as_path.exists() and (os.sep in text or text.startswith(".")):
        raise RunError(f"{text}: no such run directory")
    base = runs_dir(results_dir)
    candidates = _run_dirs(results_dir)
    if not candidates:
        where = f"{base} does not exist" if not base.is_dir() else f"{base} holds no runs"
        raise RunError(f"no run {text!r}: {where}")
    if text == LATEST:
        return max(candidates, key=lambda p: (_start_time({}, p.name, p) or datetime.min, p.name))
    exact = [p for p in candidates if p.name == text]
    if exact:
        return exact[0]
    matches = [p for p in candidates if p.name.startswith(text) or p.name.startswith("bench_" + text)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise RunError(f"no run {text!r} in {base} (see `kvbench list`)")
    shown = ", ".join(p.name for p in matches[:4]) + (", ..." if len(matches) > 4 else "")
    raise RunError(f"run id {text!r} is ambiguous: {len(matches)} runs match ({shown})")


# -- reading a run --------------------------------------------------------------------------------


def parse_records(records: object, where: str) -> list[Record]:
    """Typed records (older schema versions migrated) from their JSON list; RunError naming ``where``
    and the record's number (and key) when one is not a record."""
    if not isinstance(records, list):
        raise RunError(f"{where}: 'records' must be a list")
    parsed = []
    for number, record in enumerate(records, start=1):
        try:
            parsed.append(Record.from_json(record))
        except RecordError as exc:
            key = record.get("key") if isinstance(record, dict) and isinstance(record.get("key"), str) else None
            raise RunError(f"{where}: record {number}{f' ({key})' if key else ''}: {exc}") from None
    return parsed


def load_run(run_id_or_path: str | os.PathLike, results_dir: str | os.PathLike = "results") -> Run:
    """Read a run back: its records (records.jsonl, the live log, else run.json) and what was found
    (``Run.state``: complete, incomplete, or damaged with its records recovered; run/state.py)."""
    path = resolve_run_dir(run_id_or_path, results_dir)
    info, records, state = read_run_files(path)
    run_id = info.get("run_id") if isinstance(info.get("run_id"), str) else path.name
    return Run(run_id=run_id, path=path, info=info, records=records, state=state)


def _start_time(info: dict, run_id: str, path: Path) -> datetime | None:
    """When a run started: run.json's timestamp, else the time encoded in its id, else None."""
    stamp = info.get("start_ts")
    if isinstance(stamp, (int, float)):
        return datetime.fromtimestamp(stamp)
    start = info.get("start")
    if isinstance(start, str):
        try:
            return datetime.fromisoformat(start).replace(tzinfo=None)
        except ValueError:
            pass
    match = _RUN_ID_TIME.search(run_id)
    if match:
        try:
            return datetime.strptime(match.group(1), "%Y%m%d_%H%M%S")
        except ValueError:
            pass
    return None


def _distinct(values: Iterable[object]) -> tuple[str, ...]:
    out: list[str] = []
    for value in values:
        if value is not None and str(value) not in out:
            out.append(str(value))
    return tuple(out)


def run_info(run: Run) -> RunInfo:
    records = run.records
    return RunInfo(
        run_id=run.run_id,
        path=run.path,
        date=run.started,
        models=_distinct(r.model.name for r in records),
        methods=_distinct(r.method.name for r in records),
        budgets=_distinct(r.budget.spec for r in records),
        tasks=_distinct(r.task.name for r in records),
        commit=run.commit,
        n_records=len(records),
        complete=run.complete,
        state=run.state.label(),
    )


def list_runs(results_dir: str | os.PathLike = "results") -> list[RunInfo]:
    """Every run under ``results_dir/runs``, oldest first; a corrupt run is listed with its problem."""
    infos = []
    for path in _run_dirs(results_dir):
        try:
            infos.append(run_info(load_run(path, results_dir)))
        except RunError as exc:
            infos.append(RunInfo(run_id=path.name, path=path, date=_start_time({}, path.name, path), problem=str(exc)))
    return sorted(infos, key=lambda i: (i.date or datetime.min, i.run_id))
