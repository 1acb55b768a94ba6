"""Durable files of a run: atomic writes and crash-safe record appends.

A sweep can run for days, so nothing here may leave a half-written file behind: whole files are
written to a temporary sibling and renamed into place, and each finished item's record is
appended to ``records.jsonl`` under a file lock the moment it finishes, so that several xdist
workers (or several processes on a shared filesystem) can append at once without interleaving.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from pytest_kvbench.atomic_files import atomic_write_json, atomic_write_text, json_text

if TYPE_CHECKING:
    from filelock import FileLock

    from pytest_kvbench.results.record import Record

RECORDS_FILE = "records.jsonl"
RUN_FILE = "run.json"
RESULTS_FILE = "RESULTS.md"  # a run's table, in its directory and (the latest run's) in the results directory
SETTINGS_FILE = "settings.json"  # the grid a run was made with; --kvbench-resume checks against it


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    atomic_write_text(path, "".join(json_text(row, indent=None) + "\n" for row in rows))


def write_settings(run_dir: Path, settings: dict) -> None:
    """settings.json, once (the first record's, or the end of a run stopped before any): what --kvbench-resume
    checks a later attempt against, so it is never rewritten."""
    path = run_dir / SETTINGS_FILE
    if not path.exists():
        atomic_write_json(path, settings)


def new_run_id(now: datetime | None = None) -> str:
    """`bench_<8 hex>_<YYYYmmdd_HHMMSS>`: the name of a new run's directory."""
    now = now or datetime.now()
    return f"bench_{os.urandom(4).hex()}_{now.strftime('%Y%m%d_%H%M%S')}"


def _lock_for(path: Path) -> FileLock:
    from filelock import FileLock  # lazy for startup time: the plugin loads this module in every pytest run

    return FileLock(str(path) + ".lock")


def append_record(records_path: str | os.PathLike, record: dict,
                  amend: Callable[[dict], dict] | None = None) -> dict:
    """Append one record as one JSON line, under a lock, flushed and fsynced before returning; ``amend`` may
    change the record under the lock (RunSession: ``supersedes``, from what the file holds by then). Returns
    the record as written."""
    records_path = Path(records_path)
    records_path.parent.mkdir(parents=True, exist_ok=True)
    with _lock_for(records_path):
        record = amend(record) if amend is not None else record
        line = json_text(record, indent=None) + "\n"
        with open(records_path, "a+b") as handle:
            if handle.tell() > 0:
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":  # a writer killed mid-line: close its torn line first
                    line = "\n" + line
            handle.write(line.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
    return record


class RecordsTail:
    """What the newest record of each key in a records file says of itself (status, message, crashed), read
    incrementally: each process reads each byte once, so a run's appends stay linear in its records.

    A re-run item's record says which record it supersedes (docs/resilience.md). An xdist worker cannot know
    from its start alone: the controller appends a crash record when another worker dies, and ``--dist
    loadgroup`` then runs that item again in the same session, on any worker."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.offset = 0
        self.latest: dict[str, dict] = {}

    def update(self) -> None:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        for line in data[:end].splitlines():
            try:
                raw = json.loads(line)
            except ValueError:  # a torn or damaged line: no record (results/run/state.py names the damage)
                continue
            if isinstance(raw, dict) and isinstance(raw.get("key"), str):
                self.latest[raw["key"]] = {"status": raw.get("status"), "message": raw.get("message")} | (
                    {"crashed": True} if raw.get("crashed") else {})
        self.offset += end + 1


def read_json(path: Path, label: str, error: type[Exception]) -> Any:
    """The JSON in ``path``; an unreadable or malformed file raises ``error`` with one line
    naming ``label`` (say ``baseline x.json``) and what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise error(f"{label} is not UTF-8 text") from None
    except OSError as exc:
        raise error(f"cannot read {label}: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{label}: invalid JSON at line {exc.lineno} column {exc.colno} ({exc.msg})") from None


class RecordsError(ValueError):
    """A records file that cannot be read back (named, with the line that is wrong)."""


@dataclass
class RecordsScan:
    """Every line of a records file: the records, and the lines that are not records with what is wrong.

    A process killed in the middle of a write leaves a torn line: a prefix of a record, which starts
    with ``{`` and never ends in the record's closing brace (later appends start on a fresh line, see
    append_record). Any other line that is not a JSON object is damage (an edit, a disk error, ...).
    """

    records: list[dict] = field(default_factory=list)
    torn: list[int] = field(default_factory=list)  # line numbers of torn writes
    bad: list[tuple[int, str]] = field(default_factory=list)  # (line number, what is wrong) of the other lines
    record_lines: list[int] = field(default_factory=list)  # the line number of each record


def torn_line(text: str) -> bool:
    """A line that is a prefix of a record cut short by a killed writer (RecordsScan): no damage."""
    text = text.strip()
    return text.startswith("{") and not text.endswith("}")


def scan_records(records_path: str | os.PathLike) -> RecordsScan:
    """Read a records file line by line without stopping at a bad line (see RecordsScan); OSError and
    UnicodeDecodeError propagate."""
    records_path = Path(records_path)
    scan = RecordsScan()
    if not records_path.exists():
        return scan
    with _lock_for(records_path):
        lines = records_path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if torn_line(line):
                scan.torn.append(number)
            else:
                scan.bad.append((number, f"not a JSON record ({exc.msg})"))
            continue
        if not isinstance(record, dict):
            scan.bad.append((number, f"not a JSON object ({type(record).__name__})"))
            continue
        scan.records.append(record)
        scan.record_lines.append(number)
    return scan


def read_records(records_path: str | os.PathLike, *, tolerate_torn: bool = True) -> list[dict]:
    """Read every record of a records file.

    Torn lines of a killed writer (RecordsScan) belonged to items that did not finish: skipped when
    ``tolerate_torn``. Any other line that is not a JSON record is corruption: an error naming the
    file and line.
    """
    scan = scan_records(records_path)
    bad = sorted(scan.bad + ([] if tolerate_torn else [(n, "not a JSON record (a torn write)") for n in scan.torn]))
    if bad:
        number, problem = bad[0]
        raise RecordsError(f"{records_path}:{number}: {problem}")
    return scan.records


def latest_per_key(records: Iterable[Record]) -> list[Record]:
    """One record per case key, the last appended winning (a resumed or retried item appends again).

    Keyed by the comparison key, not the node id: node ids move with the rootdir, and runs merged
    from machines that each ran one seed share node ids.
    """
    latest: dict[str, Record] = {}
    for record in records:
        latest[record.key] = record
    return list(latest.values())
