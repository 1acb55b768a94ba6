"""How many CPUs this process may run on: light (no torch), so the plugin can size threads at configure."""

from __future__ import annotations

import os


def usable_cpu_count() -> int:
    """CPUs this process may run on (container/cgroup affinity), which is what CPU timings use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
