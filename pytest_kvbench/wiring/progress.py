"""Live progress of long items on the terminal: which item, samples done, seconds per sample, ETAs.

An item of 200 LongBench samples on an 8B model runs for many minutes behind one dot. While it runs,
the runner reports each finished sample here, and the terminal shows
``[kvbench] snapkv-128-qasper: 12/200 samples, 3.1 s/sample, item ETA 9m43s; items 4/40, session ETA 2h``.

pytest's conventions: nothing under ``-q``; on a terminal the line is rewritten in place and erased
when the item ends; elsewhere (CI logs) a plain line at each fifth of the item. Output goes around
pytest's capture (capturemanager.global_and_fixture_disabled, as live logging does), so it never
lands in a test's captured output or in --junitxml. Only the process that owns the terminal shows
it: under xdist the workers' items run silently (their results appear as usual).
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext

import pytest

PREFIX = "[kvbench]"


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class SessionProgress:
    """Items done of the session and an ETA from the finished items' mean duration."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.reporter = config.pluginmanager.get_plugin("terminalreporter")
        self.enabled = self.reporter is not None and config.get_verbosity() >= 0 and not hasattr(config, "workerinput")
        self.items_total = 0
        self.item_seconds: list[float] = []

    def item(self, item_id: str) -> ItemProgress:
        return ItemProgress(self, item_id)

    def session_part(self) -> str:
        done = len(self.item_seconds)
        part = f"items {done}/{self.items_total}"
        if done:
            left = self.items_total - done
            part += f", session ETA {_duration(left * sum(self.item_seconds) / done)}"
        return part

    def show(self, line: str, *, final: bool = False) -> None:
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else nullcontext():
            if self.reporter.isatty():
                self.reporter.ensure_newline()
                self.reporter.rewrite("" if final else line, erase=True)
            elif not final:
                self.reporter.ensure_newline()
                self.reporter.write_line(line)


class ItemProgress:
    """The runner's per-sample callback for one item: progress(done, total)."""

    def __init__(self, session: SessionProgress, item_id: str) -> None:
        self.session = session
        self.item_id = item_id
        self.started = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        if not self.session.enabled or not total:
            return
        per_sample = (time.perf_counter() - self.started) / max(done, 1)
        if not self.session.reporter.isatty() and done not in _checkpoints(total):
            return
        self.session.show(f"{PREFIX} {self.item_id}: {done}/{total} samples, {per_sample:.1f} s/sample, "
                          f"item ETA {_duration(per_sample * (total - done))}; {self.session.session_part()}")

    def finish(self) -> None:
        self.session.item_seconds.append(time.perf_counter() - self.started)
        if self.session.enabled and self.session.reporter.isatty():
            self.session.show("", final=True)


def _checkpoints(total: int) -> set[int]:
    """The sample counts at which a plain (non-terminal) line is written: every fifth of the item."""
    step = max(1, math.ceil(total / 5))
    return set(range(step, total + 1, step)) | {total}
