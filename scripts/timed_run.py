"""One timed `pytest` run in a fresh interpreter from the repository root (the measure_* scripts)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def wall_seconds(pytest_args: list[str]) -> float:
    with tempfile.TemporaryDirectory() as results:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--kvbench-results", results,
                   *pytest_args]
        start = time.perf_counter()
        proc = subprocess.run(command, cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1"),
                              capture_output=True, text=True)
        seconds = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(proc.stdout[-3000:] + proc.stderr[-2000:])
    return seconds
