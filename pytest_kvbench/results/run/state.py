"""Reading a run directory's files and saying what was found: complete, incomplete, or damaged and recovered.

A run directory holds its records twice: ``records.jsonl``, appended as each item finishes, and
``run.json``, written when the run starts (its selected items, settings and provenance, no ``end``) and
again at its end with every record. Which items did not finish is computed here from run.json's
``expected`` and the records (``unfinished_of``), by every reader and by the session itself, so every
command says the same of a run whatever stopped it (kill -9, Ctrl-C, a dead xdist worker). When one of them is damaged (run.json
truncated by a full disk, records.jsonl ending in garbage) the records are recovered from what can
still be read, so that nothing finished is lost; but the run is then not "complete": its state
names what was wrong, file and line, and ``kvbench`` exits 2 for it (a corrupt run is an error,
docs/resilience.md). A torn last line of records.jsonl is not damage: it is a record whose
writer was killed mid-write (storage.RecordsScan), i.e. an item that did not finish.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pytest_kvbench.results.run import storage
from pytest_kvbench.results.record import Record, RecordError

SHOWN_ITEMS = 8  # unfinished items named in a state line; the rest are counted
NO_RECORD = "no record: the run stopped before it finished"
LOCK_FILES = ("run.lock", "run.lock.json")  # results/run/lock.py: a run that took its lock and then nothing


class RunError(ValueError):
    """A run that cannot be found or read; the message is one line naming the file or id."""


def _named(items: tuple[str, ...]) -> str:
    return ", ".join(items[:SHOWN_ITEMS]) + (", ..." if len(items) > SHOWN_ITEMS else "")


@dataclass(frozen=True)
class RunState:
    """What reading a run found. ``damage``: one phrase per problem with its files (empty: intact).

    The one truth every command reads (``kvbench show/list/compare/merge/export``, the session's run.json):
    which selected items have no record or a crashed one (``unfinished_items``, from run.json's ``expected``
    and the records), which crashed and were run again (``crashed``), whether the run reached its end."""

    complete: bool
    has_run_file: bool
    damage: tuple[str, ...] = ()
    source: str = storage.RECORDS_FILE  # where the records were read from
    unfinished_items: tuple[dict, ...] = ()  # {item_id, key, nodeid, reason} of each item not finished
    torn_lines: tuple[int, ...] = ()  # records.jsonl lines torn by a killed writer (skipped)
    crashed: tuple[dict, ...] = ()  # {item_id, key, message} of items whose worker died, then run again
    ended: bool = True  # run.json was written at the end of the run (False: killed, or still running)
    has_records_file: bool = True

    @property
    def damaged(self) -> bool:
        return bool(self.damage)

    @property
    def unfinished(self) -> tuple[str, ...]:
        return tuple(str(u.get("item_id")) for u in self.unfinished_items)

    def label(self) -> str:
        """One line: ``complete [with N crashed items (...)]``, ``incomplete: ...``, ``started, no item finished``
        or ``damaged (what was wrong); records recovered from ...``."""
        if self.damage:
            return f"damaged ({'; '.join(self.damage)}); its records were recovered from {self.source}"
        torn = (f" (records.jsonl line {', '.join(map(str, self.torn_lines))}: torn by a killed writer, skipped)"
                if self.torn_lines else "")
        crashed = tuple(f"{c.get('item_id')}: re-run" for c in self.crashed)
        if self.complete:
            if crashed:
                return f"complete with {len(crashed)} crashed item{'s' if len(crashed) > 1 else ''} ({_named(crashed)})" + torn
            return "complete" + torn
        if not self.has_run_file and not self.has_records_file:
            return "started, no item finished (only its lock files: killed as it started, or starting now)"
        parts = []
        if not self.has_run_file:
            parts.append("no run.json (the run is still going, or was stopped before its end)")
        elif not self.ended:
            parts.append("stopped before its end (killed, or still running)")
        if self.unfinished_items:
            parts.append(f"{len(self.unfinished)} item(s) not finished ({_named(self.unfinished)})")
        elif self.has_run_file and self.ended:
            parts.append("interrupted")
        if crashed:
            parts.append(f"{len(crashed)} crashed item(s) re-run ({_named(crashed)})")
        return "incomplete: " + "; ".join(parts) + torn


def unfinished_of(expected: list[dict], records: list[Record]) -> list[dict]:
    """The selected items (``expected``: item_id, key, nodeid) with no record, or whose newest record is a crash;
    and any other item whose newest record is a crash. The one computation of what a run did not finish."""
    by_key = {r.key: r for r in records}
    out, seen = [], set()
    for item in expected:
        key = item.get("key")
        record = by_key.get(key)
        seen.add(key)
        if record is None or record.crashed:
            reason = record.message if record is not None else item.get("reason") or NO_RECORD
            out.append({"item_id": item.get("item_id"), "nodeid": item.get("nodeid"), "key": key, "reason": reason})
    for record in records:
        if record.crashed and record.key not in seen:
            out.append({"item_id": record.item_id or record.key, "nodeid": record.nodeid, "key": record.key,
                        "reason": record.message})
    return out


def crashed_then_run(history: list[Record], records: list[Record]) -> list[dict]:
    """Items with a crash record in ``history`` (records.jsonl, oldest first) whose newest record is not one."""
    newest = {r.key: r for r in records}
    out: dict[str, dict] = {}
    for record in history:
        latest = newest.get(record.key)
        if record.crashed and latest is not None and not latest.crashed:
            out[record.key] = {"item_id": record.item_id or record.key, "key": record.key, "message": record.message}
    return list(out.values())


def expected_items(info: dict) -> list[dict] | None:
    """The items a run selected, from run.json (None: a run.json of an older version, which has none)."""
    expected = info.get("expected")
    return [e for e in expected if isinstance(e, dict)] if isinstance(expected, list) else None


def run_expected(info: dict, records: list[Record]) -> list[dict]:
    """What a run had to finish: run.json's ``expected``; for a run.json of an older version (or none), the
    items its ``unfinished`` names and those with a record."""
    expected = expected_items(info)
    if expected is not None:
        return expected
    listed = info.get("unfinished") if isinstance(info.get("unfinished"), list) else []
    return [u for u in listed if isinstance(u, dict)] + [
        {"item_id": r.item_id, "key": r.key, "nodeid": r.nodeid} for r in records]


def parse_record(raw: object) -> tuple[Record | None, str | None]:
    """(the record, None), or (None, what makes it unusable by the read commands): the one check of a
    record read back, for both files (the typed record's own reading: results/record/__init__.py)."""
    try:
        return Record.from_json(raw), None
    except RecordError as exc:
        return None, str(exc)


def _parse_all(raws: list, where: list) -> tuple[list[Record], list[tuple[object, str]]]:
    """The usable records of ``raws`` and (where, what is wrong) of the others; ``where``: each one's place."""
    records, problems = [], []
    for number, (raw, place) in enumerate(zip(raws, where), start=1):
        record, problem = parse_record(raw)
        if problem is None:
            records.append(record)
        else:
            problems.append((place, f"record {number} {problem}"))
    return records, problems


def _summary(problems: list[str]) -> str:
    return problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")


def _read_info(path: Path, damage: list[str]) -> tuple[dict, list[Record] | None]:
    """run.json's content and its usable records (None: no run.json, or none readable)."""
    if not path.exists():
        return {}, None
    try:
        info = storage.read_json(path, str(path), RunError)
    except RunError as exc:
        damage.append(str(exc))
        return {}, None
    if not isinstance(info, dict):
        damage.append(f"{path}: run.json must be a JSON object, found {type(info).__name__}")
        return {}, None
    raws = info.get("records", [])
    if not isinstance(raws, list):
        damage.append(f"{path}: 'records' must be a list")
        return info, None
    records, problems = _parse_all(raws, [path] * len(raws))
    if problems:
        damage.append(_summary([f"{place}: {problem}" for place, problem in problems]))
    return info, records


def _read_log(path: Path, damage: list[str]) -> tuple[list[Record] | None, tuple[int, ...]]:
    """records.jsonl's usable records (None: no file, or unreadable) and its torn lines."""
    if not path.exists():
        return None, ()
    try:
        scan = storage.scan_records(path)
    except UnicodeDecodeError:
        damage.append(f"{path}: records file is not UTF-8 text")
        return None, ()
    except OSError as exc:
        damage.append(f"cannot read {path}: {exc.strerror or exc}")
        return None, ()
    records, problems = _parse_all(scan.records, scan.record_lines)
    problems = sorted(scan.bad + problems)
    if problems:
        damage.append(_summary([f"{path}:{line}: {problem}" for line, problem in problems]))
    return records, tuple(scan.torn)


def read_run_files(path: Path) -> tuple[dict, list[Record], RunState]:
    """(run.json's content, the records, the state) of the run directory ``path``.

    The records are records.jsonl's (the live log, one per item, the last appended winning); records
    that only run.json still holds are added back and named as damage. RunError when neither file
    yields a record and one of them is damaged: there is nothing to recover.
    """
    damage: list[str] = []
    info, info_records = _read_info(path / storage.RUN_FILE, damage)
    log_records, torn = _read_log(path / storage.RECORDS_FILE, damage)
    sources = []
    records = storage.latest_per_key(log_records or [])
    if log_records is not None:
        sources.append(storage.RECORDS_FILE)
    if info_records:
        have = {r.key for r in records}
        only_in_info = [r for r in info_records if r.key not in have]
        if only_in_info and log_records is not None:
            damage.append(f"records.jsonl lacks {len(only_in_info)} record(s) that run.json holds")
        if only_in_info:
            records += only_in_info
            sources.append(storage.RUN_FILE)
    if damage and not records:
        raise RunError(damage[0])
    expected = run_expected(info, records)
    has_run_file = (path / storage.RUN_FILE).exists()
    unfinished = unfinished_of(expected, records)
    ended = bool(info.get("end")) or not has_run_file
    state = RunState(
        complete=bool(info.get("complete")) and ended and has_run_file and not damage and not unfinished,
        has_run_file=has_run_file, damage=tuple(damage), source=" and ".join(sources) or storage.RUN_FILE,
        unfinished_items=tuple(unfinished), torn_lines=torn, crashed=tuple(crashed_then_run(log_records or [], records)),
        ended=ended, has_records_file=(path / storage.RECORDS_FILE).exists())
    return info, records, state
