"""The files written when a run ends, each on its own: a failure is one line, never a traceback.

A run ends by writing its item folders, run.json, RESULTS.md and the ``--kvbench-save`` baseline,
after every item's record is already safe in records.jsonl. A full disk or a permission taken
away during a long run used to surface here as a 69-line traceback, with the files after the
failing one never attempted. Each file is now written on its own; what could not be written is
named in one line with the path, the reason and what was kept, and the run exits 1 (an output
asked for is missing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from pytest_kvbench.user_paths import shown


@dataclass(frozen=True)
class WriteFailure:
    what: str  # "run.json", "the run's RESULTS.md", "item folder", "baseline", ...
    detail: str  # the path and why it could not be written


def write_each(files: Iterable[tuple[str, Path, Callable[[], object]]]) -> tuple[list[str], list[WriteFailure]]:
    """Call each writer; (what was written, what failed and why). Only OSError (the disk, permissions)
    is caught: anything else is a bug and keeps its traceback."""
    written, failed = [], []
    for what, path, write in files:
        try:
            write()
        except OSError as exc:
            failed.append(WriteFailure(what, f"{shown(path)}: {(exc.strerror or str(exc)).lower()}"))
        else:
            written.append(what)
    return written, failed


def failure_line(failures: list[WriteFailure], kept: list[str]) -> str:
    """One line: each kind of file not written (its first path and reason, how many), then what was kept."""
    by_what: dict[str, list[WriteFailure]] = {}
    for failure in failures:
        by_what.setdefault(failure.what, []).append(failure)
    parts = [f"{f'{len(group)} {what}s' if len(group) > 1 else what} ({group[0].detail})"
             for what, group in by_what.items()]
    return f"kvbench: not written: {'; '.join(parts)}; kept: {', '.join(kept)}"
