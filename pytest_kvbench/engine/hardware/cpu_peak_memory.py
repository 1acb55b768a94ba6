"""One item's peak resident memory on CPU: the kernel's ``VmHWM`` reset per item where it can be."""

from __future__ import annotations

import os
import resource
import sys
from collections.abc import Callable
from pathlib import Path

from pytest_kvbench.engine.hardware.sampler import PeriodicSampler

_PROC_SELF = Path("/proc/self")


def _status_kb(proc_self: Path) -> dict[str, int]:
    """``VmRSS`` / ``VmHWM`` (kB) from one read of ``/proc/self/status`` (a consistent pair)."""
    values: dict[str, int] = {}
    with open(proc_self / "status", encoding="ascii", errors="replace") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0])
    return values


def reset_peak_rss(proc_self: Path = _PROC_SELF) -> bool:
    """Reset the kernel's peak-RSS mark (``VmHWM``) by writing 5 to ``/proc/self/clear_refs``.

    ``ru_maxrss`` can never be reset, so this is the only exact per-item CPU peak. Returns True
    only if the reset is verified (``VmHWM`` dropped to the current RSS): some sandboxes accept
    the write and ignore it.
    """
    try:
        with open(proc_self / "clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        values = _status_kb(proc_self)
    except (OSError, ValueError, IndexError):
        return False
    if "VmHWM" not in values or "VmRSS" not in values:
        return False
    return values["VmHWM"] - values["VmRSS"] <= 1024  # one snapshot; allow 1 MiB of page churn


def peak_rss_bytes(proc_self: Path = _PROC_SELF) -> int | None:
    """``VmHWM`` in bytes: the peak resident memory since the last ``reset_peak_rss``."""
    try:
        return _status_kb(proc_self)["VmHWM"] * 1024
    except (OSError, KeyError, ValueError, IndexError):
        return None


def current_rss_bytes(proc_self: Path = _PROC_SELF) -> int:
    """Resident memory now, from ``/proc/self/statm`` (raises OSError where there is no /proc)."""
    with open(proc_self / "statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def lifetime_max_rss_bytes() -> int:
    """``ru_maxrss`` in bytes: the process's peak since it started (kB on Linux, bytes on macOS)."""
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024


class CpuPeakMeter:
    """Per-item CPU peak RSS: exact ``VmHWM`` reset, else RSS sampling, else lifetime ``ru_maxrss``.

    ``method`` records which one was used, because they mean different things in a paper:
    "vmhwm" is exact, "rss_sampling" is a lower bound (a spike between samples is missed), and
    "ru_maxrss_lifetime" is the peak of the whole process, not of this item.
    """

    def __init__(self, clock: Callable[[], float], interval_s: float) -> None:
        self._clock = clock
        self._interval_s = interval_s
        self._sampler: PeriodicSampler | None = None
        self.method: str | None = None

    def start(self) -> None:
        if reset_peak_rss():
            self.method = "vmhwm"
            return
        sampler = PeriodicSampler(current_rss_bytes, interval_s=self._interval_s, clock=self._clock)
        try:
            self._sampler = sampler.start()
            self.method = "rss_sampling"
        except (OSError, ValueError, IndexError):
            self.method = "ru_maxrss_lifetime"

    def stop(self) -> int | None:
        if self.method == "vmhwm":
            peak = peak_rss_bytes()
            if peak is not None:
                return peak
            self.method = "ru_maxrss_lifetime"
        if self.method == "rss_sampling":
            return int(max(value for _, value in self._sampler.stop()))
        return lifetime_max_rss_bytes()
