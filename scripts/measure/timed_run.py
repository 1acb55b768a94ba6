"""Timed runs in a fresh interpreter for the measure_* and compare_* scripts, and their medians.

A run is timed from its start to its exit, so it pays its imports and start-up as a user does. Besides wall
time each run reports the CPU seconds (user + system) of the child and everything it waited for (getrusage
of children): on a shared machine wall time grows with the neighbours' load, CPU time far less, so it is
the fairer figure there. The 1-minute load average at the start says how loaded the machine was.
Bytecode caching is on in the child (PYTHONDONTWRITEBYTECODE dropped), as on a user's machine.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Timing:
    wall_s: float
    cpu_s: float  # user + system seconds of the child process tree
    load: float  # 1-minute load average when the run started


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_command(command: list[str], cwd: Path = ROOT) -> Timing:
    """Run `command` from `cwd` (the repository root); exit with its output if it fails."""
    load, cpu, start = os.getloadavg()[0], _cpu_seconds(), time.perf_counter()
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.run(command, cwd=cwd, env=dict(environment, HF_HUB_OFFLINE="1"),
                          capture_output=True, text=True)
    timing = Timing(time.perf_counter() - start, _cpu_seconds() - cpu, load)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return timing


def timed_pytest(pytest_args: list[str], python: str = sys.executable) -> tuple[Timing, list]:
    """One `pytest` run (by `python`: another environment's) into a fresh results directory: its timing and
    the records it wrote."""
    with tempfile.TemporaryDirectory() as results:
        timing = timed_command([python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                "--kvbench-results", results, *pytest_args])
        lines = [line for path in Path(results).glob("runs/*/records.jsonl") for line in path.read_text().splitlines()]
    from pytest_kvbench.results.record import Record

    return timing, [Record.from_json(json.loads(line)) for line in lines if line.strip()]


def wall_seconds(pytest_args: list[str]) -> float:
    return timed_pytest(pytest_args)[0].wall_s


def print_medians(timings: dict[str, list[Timing]]) -> dict[str, Timing]:
    """One line per variant: medians of its rounds (each round listed), and the medians returned."""
    medians = {}
    for name, runs in timings.items():
        medians[name] = Timing(*(statistics.median(getattr(run, field) for run in runs)
                                 for field in ("wall_s", "cpu_s", "load")))
        rounds = ", ".join(f"{run.wall_s:.2f}/{run.cpu_s:.2f}" for run in runs)
        print(f"{name:40s} median wall {medians[name].wall_s:7.2f} s, CPU {medians[name].cpu_s:7.2f} s, "
              f"load {medians[name].load:4.1f}  (wall/CPU per round: {rounds})")
    return medians


def print_ratio(label: str, ours: Timing, theirs: Timing) -> None:
    print(f"{label}: wall {ours.wall_s / theirs.wall_s:.2f}x, CPU {ours.cpu_s / theirs.cpu_s:.2f}x")
