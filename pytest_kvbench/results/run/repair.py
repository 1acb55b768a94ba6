"""What ``--kvbench-resume`` repairs in a damaged run before running, said in one line.

A resumed run used to rewrite a damaged run without a word: a garbage line of records.jsonl stayed there (and the
run read as damaged forever), a truncated run.json was replaced. Now, with the run's lock held and before any
item runs, the damage results/run/state.py names is repaired and the repair is one line on stderr:

- lines of records.jsonl that are not records move to ``records.jsonl.damaged`` (appended, so nothing is lost);
  a torn last line (a writer killed mid-line) is no damage and stays;
- an unreadable run.json is kept as ``run.json.damaged``; the resumed run writes a new one;
- records that only run.json held (records.jsonl lost them) are appended to records.jsonl.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pytest_kvbench.atomic_files import atomic_write_text
from pytest_kvbench.results.run import storage
from pytest_kvbench.results.run.state import parse_record

DAMAGED_SUFFIX = ".damaged"


def _is_record(line: bytes) -> bool | None:
    """True: a record; None: a torn write (no damage); False: anything else."""
    try:
        text = line.decode("utf-8").strip()
    except UnicodeDecodeError:
        return False
    if not text:
        return True
    try:
        raw = json.loads(text)
    except ValueError:
        return None if storage.torn_line(text) else False
    return parse_record(raw)[1] is None


def _repair_log(log: Path) -> tuple[str | None, set[str]]:
    """Move records.jsonl's lines that are not records aside; (what was done, the keys it holds)."""
    if not log.exists():
        return None, set()
    lines = log.read_bytes().splitlines(keepends=True)
    verdicts = [_is_record(line) for line in lines]
    bad = [number for number, verdict in enumerate(verdicts, start=1) if verdict is False]
    keys = set()
    for line, verdict in zip(lines, verdicts):
        if verdict:
            try:
                keys.add(json.loads(line).get("key"))
            except (ValueError, AttributeError):
                pass
    if not bad:
        return None, keys
    with open(str(log) + DAMAGED_SUFFIX, "ab") as aside:
        aside.writelines(line if line.endswith(b"\n") else line + b"\n" for number, line in enumerate(lines, start=1)
                         if number in bad)
    kept = b"".join(line for number, line in enumerate(lines, start=1) if number not in bad)
    atomic_write_text(log, kept.decode("utf-8", errors="replace"))
    shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
    return (f"{len(bad)} line(s) of records.jsonl that are not records (line {shown}) moved to "
            f"records.jsonl{DAMAGED_SUFFIX}"), keys


def _repair_run_file(run_file: Path) -> tuple[str | None, list]:
    """Keep an unreadable run.json aside; (what was done, the raw records a readable one holds)."""
    if not run_file.exists():
        return None, []
    try:
        info = json.loads(run_file.read_text(encoding="utf-8"))
        if not isinstance(info, dict) or not isinstance(info.get("records", []), list):
            raise ValueError("not a run")
    except (OSError, ValueError):
        os.replace(run_file, str(run_file) + DAMAGED_SUFFIX)
        return f"run.json could not be read: kept as run.json{DAMAGED_SUFFIX}, written again by this run", []
    return None, info.get("records", [])


def repair(run_dir: Path) -> str | None:
    """Repair a damaged run in place (its lock held by the caller); one line saying what was done, or None."""
    done = []
    log_note, keys = _repair_log(run_dir / storage.RECORDS_FILE)
    run_note, raws = _repair_run_file(run_dir / storage.RUN_FILE)
    done += [note for note in (log_note, run_note) if note]
    only_in_run = [raw for raw in raws if isinstance(raw, dict) and raw.get("key") not in keys
                   and _is_record(json.dumps(raw).encode())]
    for raw in only_in_run:
        storage.append_record(run_dir / storage.RECORDS_FILE, raw)
    if only_in_run:
        done.append(f"{len(only_in_run)} record(s) that only run.json held appended to records.jsonl")
    if not done:
        return None
    return f"kvbench: --kvbench-resume {run_dir.name} found the run damaged and repaired it before running: " + \
        "; ".join(done)
