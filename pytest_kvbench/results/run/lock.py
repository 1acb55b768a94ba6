"""One process at a time runs (or resumes) a run directory: a file lock in the directory, and who holds it.

Two ``--kvbench-resume`` of the same run at once both ran the missing items and appended each record twice;
a resume of a run still running would do the same. The controller takes ``run.lock`` (filelock: an OS lock,
so a process that dies, even by kill -9, releases it) before any item runs and keeps it until pytest
unconfigures; xdist workers append under their controller's lock. Beside the lock, ``run.lock.json`` says who
holds it (pid, host, since, command), so a refused second process can name the holder in its one line. That
file is informative only: after a crash it may stay behind, naming a process that no longer holds anything.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from filelock import Timeout

LOCK_FILE = "run.lock"
HOLDER_FILE = "run.lock.json"


class RunInUse(RuntimeError):
    """The run directory is locked by another process; the message is one line naming it."""


class RunLock:
    """The lock of one run directory, taken at once or refused (no waiting: the holder may run for days)."""

    def __init__(self, run_dir: Path) -> None:
        from filelock import FileLock  # lazy: the plugin loads in every pytest run of its users

        self.run_dir = Path(run_dir)
        self._lock = FileLock(str(self.run_dir / LOCK_FILE), timeout=0)

    def acquire(self) -> RunLock:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._lock.acquire()
        except Timeout:
            raise RunInUse(f"run {self.run_dir.name} is in use by {describe_holder(self.run_dir)}; wait for it "
                           f"to end (or stop it) and try again") from None
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "command": " ".join(["pytest", *sys.argv[1:]]).replace("\n", " ")}
        (self.run_dir / HOLDER_FILE).write_text(json.dumps(holder) + "\n", encoding="utf-8")
        return self

    @property
    def held(self) -> bool:
        return self._lock.is_locked

    def release(self) -> None:
        if self._lock.is_locked:
            (self.run_dir / HOLDER_FILE).unlink(missing_ok=True)
            self._lock.release()


def describe_holder(run_dir: Path) -> str:
    """``process 123 on host (since ..., `pytest ...`)`` from the holder file, or ``another process``."""
    try:
        holder = json.loads((Path(run_dir) / HOLDER_FILE).read_text(encoding="utf-8"))
        command = str(holder.get("command", ""))
        command = command if len(command) <= 80 else command[:77] + "..."
        return f"process {holder['pid']} on {holder['host']} (since {holder['since']}: {command})"
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return "another process"


def held_by_another(run_dir: Path) -> str | None:
    """Who holds the run directory's lock (``describe_holder``) when another process does; None when it is free
    (taken and given back at once) or cannot be tried (a directory this process may not write)."""
    from filelock import FileLock  # lazy: the plugin loads in every pytest run of its users

    path = Path(run_dir) / LOCK_FILE
    if not path.exists():
        return None
    lock = FileLock(str(path), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        return describe_holder(run_dir)
    except OSError:
        return None
    lock.release()
    return None
