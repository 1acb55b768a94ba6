"""A value read periodically in a background thread: GPU power, CPU resident memory."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class PeriodicSampler:
    """Reads a value at ``start()``, every ``interval_s`` in a daemon thread, and at ``stop()``.

    The first and last readings are taken synchronously, so even an item shorter than the
    interval gets two samples spanning its whole duration. ``clock`` is injectable so tests
    build samples from fake timestamps instead of sleeping. Readings that fail in the thread
    are skipped (NVML has transient errors); a failing first reading propagates from ``start``
    so callers can tell "this source does not work here". One sampler measures one interval.
    """

    def __init__(self, read: Callable[[], float], interval_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._interval_s = interval_s
        self._clock = clock
        self._samples: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PeriodicSampler:
        self._samples = [(self._clock(), float(self._read()))]
        self._thread = threading.Thread(target=self._run, name="kvbench-sampler", daemon=True)
        self._thread.start()
        return self

    def sample(self) -> None:
        """Take one reading now (the thread calls this; tests may too)."""
        value = float(self._read())
        now = self._clock()
        with self._lock:
            self._samples.append((now, value))

    def stop(self) -> list[tuple[float, float]]:
        """Stop the thread, take the final reading, return all ``(time, value)`` samples."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            self.sample()
        except Exception:  # noqa: BLE001 - a failed last reading must not fail the item
            pass
        with self._lock:
            return list(self._samples)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - skip a transient failure, keep sampling
                continue
