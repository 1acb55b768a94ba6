"""The xdist controller's view of its workers' progress: their latest snapshots, shown on its terminal.

Under ``-n`` the items run in workers, whose output goes nowhere; each worker sends a snapshot
after every sample (progress.SessionProgress.snapshot) and the controller shows them here.
Snapshots arrive in execnet's receiver threads, while pytest's main thread writes the dots of
finished items; one lock keeps the two apart, and the main thread takes the terminal with
``terminal_turn()`` (progress.ProgressPlugin wraps the hooks that write dots), which clears the
progress row meanwhile.

On a terminal: one line for all busy workers on the row below the dots, cut to the terminal's
width. It is drawn with VT100 moves written raw (``write_raw``, which pytest's line accounting
does not see): step down a row, draw, step back to where pytest's cursor was. So the dots line
stays whole and pytest's ``[ 50%]`` column stays right. Elsewhere (CI logs): a plain line per
worker and sample, on a line of its own, at most one per worker every ``interval`` seconds
(ini ``kvbench_progress_interval``).

The session's ETA: with sharing groups known (``--dist loadgroup`` with shared prefill) the groups' cost
model of progress/workers_eta.py, fed the workers' snapshots and the controller's item reports
(``item_started``, ``item_finished``); else the mean of the finished items (text.mean_item_left).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pytest_kvbench.wiring.progress.text import PREFIX, mean_item_left, session_part, start_own_line, worker_part
from pytest_kvbench.wiring.progress.workers_eta import Running, WorkersEstimate


# VT100: index (down a row, scrolling at the bottom, same column), reverse index (up a row),
# save / restore the cursor, carriage return + erase to the end of the row.
DOWN, UP, SAVE, RESTORE, CLEAR_ROW = "\x1bD", "\x1bM", "\x1b7", "\x1b8", "\r\x1b[K"


def _worker_order(worker: str) -> tuple[int, str]:
    """gw2 before gw10."""
    digits = worker.lstrip("gw")
    return (int(digits), worker) if digits.isdigit() else (-1, worker)


class WorkersBoard:
    """Snapshots by worker id in, progress out (TTY: one row redrawn below the dots; else throttled lines)."""

    def __init__(self, reporter, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.reporter = reporter
        self.interval = interval
        self.clock = clock
        self.lock = threading.Lock()
        self.snapshots: dict[str, dict] = {}
        self.connected: set[str] = set()  # workers whose channel is open: the session's parallelism
        self.last_line: dict[str, float] = {}
        self.shown = False  # the row below the cursor holds a progress line
        self.closed = False
        self.estimate: WorkersEstimate | None = None  # the sharing groups' model, where the run has them

    def model(self, estimate: WorkersEstimate | None) -> None:
        """The sharing groups' model the session ETA comes from (None: the mean of the finished items)."""
        with self.lock:
            self.estimate = estimate

    def item_started(self, item: str) -> None:
        """The controller's report that a worker started the item (its id)."""
        with self.lock:
            if self.estimate is not None:
                self.estimate.start(item)

    def item_finished(self, item: str, seconds: float) -> None:
        """The controller's report that the item ended after ``seconds``."""
        with self.lock:
            if self.estimate is not None:
                self.estimate.finish(item, seconds)

    def connect(self, worker: str) -> None:
        with self.lock:
            self.connected.add(worker)

    def update(self, worker: str, snapshot: dict) -> None:
        """A worker's snapshot: item None once its item finished (its counts still matter)."""
        with self.lock:
            if self.closed:
                return
            self.snapshots[worker] = snapshot
            if self.reporter.isatty():
                self._draw()
            elif snapshot["item"] is not None and self._due(worker):
                start_own_line(self.reporter)
                self.reporter.write_line(f"{PREFIX} {worker_part(worker, snapshot)}; {self.session_part()}")

    def disconnect(self, worker: str) -> None:
        """The worker's channel closed (it finished or died): it runs nothing any more."""
        with self.lock:
            self.connected.discard(worker)
            if worker in self.snapshots:
                self.snapshots[worker] = dict(self.snapshots[worker], item=None)
            if self.reporter.isatty() and not self.closed:
                self._draw()

    @contextmanager
    def terminal_turn(self) -> Iterator[None]:
        """The main thread writes to the terminal (it may wrap onto the progress row): the row is
        cleared meanwhile and drawn again below wherever pytest's cursor ends up."""
        with self.lock:
            shown = self.shown
            self._erase()
            try:
                yield
            finally:
                if shown and not self.closed:
                    self._draw()

    def close(self) -> None:
        with self.lock:
            self._erase()
            self.closed = True

    def _due(self, worker: str) -> bool:
        now = self.clock()
        if worker in self.last_line and now - self.last_line[worker] < self.interval:
            return False
        self.last_line[worker] = now
        return True

    def session_part(self) -> str:
        """Items done of the session and its ETA, from the workers' latest snapshots."""
        shots = self.snapshots.values()
        done, total = sum(s["items_done"] for s in shots), max(s["items_total"] for s in shots)
        if self.estimate is not None:
            running = [r for r in map(Running.of, shots) if r is not None]
            return session_part(done, total, self.estimate.remaining(running, len(self.connected)))
        return session_part(done, total, mean_item_left(done, total, sum(s["items_seconds"] for s in shots),
                                                        parallel=len(self.connected)))

    def _draw(self) -> None:
        busy = [worker_part(w, self.snapshots[w]) for w in sorted(self.snapshots, key=_worker_order)
                if self.snapshots[w]["item"] is not None]
        if not busy:
            self._erase()
            return
        line = f"{PREFIX} {'; '.join(busy)}; {self.session_part()}"[:shutil.get_terminal_size().columns - 1]
        self.reporter.write_raw(DOWN + UP + SAVE + DOWN + CLEAR_ROW + line + RESTORE, flush=True)
        self.shown = True

    def _erase(self) -> None:
        if self.shown:
            self.reporter.write_raw(SAVE + DOWN + CLEAR_ROW + RESTORE, flush=True)
            self.shown = False
