"""What the measurement scripts of scripts/measure/ share: this checkout's packages on sys.path, timed runs in a
fresh interpreter and their medians, children measured in a fresh interpreter, /proc memory fields, a fixed
random prompt. Tiny models come from kvmethods/testing.py (the tests' own), never from tests/.

A run is timed from its start to its exit, so it pays its imports and start-up as a user does. Besides wall
time each run reports the CPU seconds (user + system) of the child and everything it waited for (getrusage
of children): on a shared machine wall time grows with the neighbours' load, CPU time far less, so it is
the fairer figure there. The 1-minute load average at the start says how loaded the machine was.
Bytecode caching is on in the child (PYTHONDONTWRITEBYTECODE dropped), as on a user's machine.
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(ROOT))  # this checkout's kvmethods and pytest_kvbench, whatever is installed


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


def run_child(script: str, arguments: list[str]) -> dict:
    """Run `script arguments` in a fresh Python and return the JSON of its last output line."""
    # a fixed mmap threshold makes every large tensor its own mapping, returned to the kernel when freed,
    # so the resident-set peak follows live tensor bytes instead of allocator caching
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}
    done = subprocess.run([sys.executable, script, *arguments], check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def status_kib(field: str) -> int:
    """A /proc/self/status field in KiB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def prompt_ids(length: int) -> list[int]:
    """The same random prompt (token ids 3..31999, seed 0) for every method and run."""
    import torch  # the timing helpers above are used by scripts that never load torch

    return torch.randint(3, 32000, (length,), generator=torch.Generator().manual_seed(0)).tolist()


def require_positive(parser: argparse.ArgumentParser, args: argparse.Namespace, names: tuple[str, ...]) -> None:
    """Refuse, in argparse's one line, any of these integer options below 1 (a count of rounds, tokens, threads...)."""
    for name in names:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer")
