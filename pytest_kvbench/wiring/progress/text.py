"""How a progress line reads: durations, one xdist worker's part, the session's part.

Shared by the single-process line (live.py) and the controller's line of the workers under
``-n`` (progress/board.py), so both speak the same words:
``gw0 snapkv-128-qasper 12/200 2.1 s/sample ETA 6m50s`` and ``items 4/40, session ETA 12m``, and how the
members of the group decoded for the last sample: ``33 members decoded in one batch``.
"""

from __future__ import annotations

from collections.abc import Sequence

PREFIX = "[kvbench]"


def start_own_line(reporter) -> None:
    """Go to the start of a line before writing a progress line: after dots (pytest's own
    ``ensure_newline`` knows only of a file name it wrote, and there is none under xdist or in logs)."""
    if reporter._tw.width_of_current_line:  # only pytest's TerminalWriter keeps count
        reporter.write("\n")
    reporter.ensure_newline()


def duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def session_part(done: int, total: int, left: float | None) -> str:
    """Items done of the session and the seconds ``left`` (None: no estimate yet)."""
    part = f"items {done}/{total}"
    if left is not None:
        part += f", session ETA {duration(left)}"
    return part


def mean_item_left(done: int, total: int, seconds: float, parallel: int = 1) -> float | None:
    """The items left spread over ``parallel`` processes at the mean duration of the ``done`` items,
    which took ``seconds`` in all (the xdist board's estimate where the run has no sharing groups:
    progress/workers_eta.py models them)."""
    return (total - done) * seconds / done / max(parallel, 1) if done else None


def _members(count: int) -> str:
    return f"{count} member{'s' if count != 1 else ''}"


def batch_note(batches: Sequence[int]) -> str | None:
    """How the members decoded since the last line did: ``batches`` holds each (member, sample)'s
    ``decode_batch`` (1: alone). None when the item's run decoded no member (a later item of its group)."""
    if not batches:
        return None
    batched = [size for size in batches if size > 1]
    alone = len(batches) - len(batched)
    if not batched:
        return f"{_members(alone)} decoded alone"
    count = max(1, round(sum(1 / size for size in batched)))  # a batch of n has n members, each saying n
    note = f"{_members(len(batched))} decoded in {'one batch' if count == 1 else f'{count} batches'}"
    return note + (f", {alone} alone" if alone else "")


def worker_part(worker: str, snapshot: dict) -> str:
    """One busy worker's item, from the snapshot it sent (progress.SessionProgress.snapshot)."""
    done, total, per_sample = snapshot["done"], snapshot["total"], snapshot["per_sample"]
    part = f"{worker} {snapshot['item']} {done}/{total} {per_sample:.1f} s/sample ETA {duration(per_sample * (total - done))}"
    note = snapshot.get("batch")  # absent in a snapshot of an older worker
    return f"{part} ({note})" if note else part
