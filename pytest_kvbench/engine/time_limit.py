"""The per-item time limit (``--kvbench-timeout``): a SIGALRM timer around one item's work."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

TIMEOUT_OPTION = "--kvbench-timeout"


class ItemTimeout(TimeoutError):
    """The item ran past its time limit."""


@dataclass
class TimeLimit:
    """What ``item_time_limit`` did: ``enforced`` is False where it could not arm a timer."""

    seconds: float | None
    enforced: bool
    reason: str = ""


def _alarm_unavailable() -> str:
    if not hasattr(signal, "setitimer") or not hasattr(signal, "SIGALRM"):
        return "this platform has no SIGALRM"
    if threading.current_thread() is not threading.main_thread():
        return "signals can only be handled in the main thread"
    return ""


class item_time_limit:  # noqa: N801 - used like contextlib's lowercase context managers
    """Raise ``ItemTimeout`` in the main thread once ``seconds`` have passed inside the block.

    Uses ``signal.setitimer`` + ``SIGALRM`` (POSIX, main thread; xdist runs tests there). It is a
    documented no-op (``TimeLimit.enforced`` False, with the reason) for ``None`` / ``<= 0``, off
    the main thread, on platforms without ``SIGALRM``, and when an earlier-firing ``SIGALRM``
    timer (e.g. pytest-timeout's) is already set, which is left alone. Python handles the
    signal between bytecodes, so one long CUDA/C call finishes before the item stops. A timer
    that was set before is restored with its remaining time on exit.
    """

    def __init__(self, seconds: float | None, where: str = "item") -> None:
        self.seconds = seconds
        self.where = where
        self._previous_handler = None
        self._previous_timer: tuple[float, float] = (0.0, 0.0)
        self._started = 0.0
        self.status = TimeLimit(seconds, enforced=False)

    def __enter__(self) -> TimeLimit:
        if self.seconds is None or self.seconds <= 0:
            self.status.reason = "no time limit set"
            return self.status
        reason = _alarm_unavailable()
        if reason:
            self.status.reason = reason
            return self.status
        previous = signal.getitimer(signal.ITIMER_REAL)
        if 0 < previous[0] <= self.seconds:
            self.status.reason = "an earlier SIGALRM timer is already set"
            return self.status
        self._previous_timer = previous
        self._previous_handler = signal.signal(signal.SIGALRM, self._on_alarm)
        self._started = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        self.status.enforced = True
        return self.status

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not self.status.enforced:
            return False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._previous_handler)
        delay, interval = self._previous_timer
        if delay > 0:
            remaining = delay - (time.monotonic() - self._started)
            signal.setitimer(signal.ITIMER_REAL, max(remaining, 1e-6), interval)
        if isinstance(exc, ItemTimeout):
            # The alarm can land on an instruction that has no line number (CPython 3.11), and pytest then
            # fails to render the traceback: an INTERNALERROR instead of a failed item. A fresh exception
            # raised here carries only frames with known lines.
            raise ItemTimeout(str(exc)) from None
        return False

    @contextmanager
    def paused(self, seconds: float | None, where: str) -> Iterator[None]:
        """Another item's work done inside this one (a reference group's shared decoding) runs on that
        item's clock: this timer stops meanwhile and ``item_time_limit(seconds, where)`` runs instead."""
        left = signal.setitimer(signal.ITIMER_REAL, 0)[0] if self.status.enforced else 0.0
        try:
            with item_time_limit(seconds, where):
                yield
        finally:
            if self.status.enforced:
                signal.setitimer(signal.ITIMER_REAL, max(left, 1e-6))

    def _on_alarm(self, signum, frame) -> None:
        raise ItemTimeout(f"{self.where} exceeded its time limit of {self.seconds:g} s ({TIMEOUT_OPTION})")
