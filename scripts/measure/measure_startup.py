"""What the plugin costs a pytest run: unused (a one-test file elsewhere) and collecting the full bench grid.

Issue 27's targets: installed but unused, the plugin adds at most 0.15 s to an unrelated pytest run (a
one-test file in a temporary folder, with vs `-p no:kvbench`); collecting the whole bench grid (every
task `kvbench tasks` lists) takes at most 1.5 s. Variants run interleaved, round after round, so the
neighbours' load falls on all alike; medians of wall and CPU seconds and the load average are printed.
`--code DIR` (repeatable) measures copies of the package with the same interpreter, e.g. this checkout and
`git archive main` unpacked, for before/after figures from the same rounds.

    python scripts/measure/measure_startup.py --rounds 5 [--code . --code /tmp/kvbench-main]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, Timing, print_medians, timed_command

ONE_TEST = "def test_one():\n    assert 1 + 1 == 2\n"
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]


def all_tasks(code: Path) -> list[str]:
    """Every task name, as `kvbench tasks` lists them (read from the measured code)."""
    listing = subprocess.run([sys.executable, "-c", "from pytest_kvbench.tasks.registry import available_tasks; "
                              "print(','.join(available_tasks()))"], env=dict(os.environ, PYTHONPATH=str(code)),
                             capture_output=True, text=True, check=True)
    return listing.stdout.strip().split(",")


def measured(code: Path, command: list[str], cwd: Path) -> Timing:
    os.environ["PYTHONPATH"] = str(code)  # the child imports the measured copy, not the installed one
    return timed_command(command, cwd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--code", type=Path, action="append", help="a copy of pytest-kvbench to measure "
                        "(repeatable; default: this checkout)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    codes = [code.resolve() for code in args.code or [ROOT]]
    for code in codes:
        if not (code / "pytest_kvbench" / "plugin.py").is_file():
            parser.error(f"--code {code}: no pytest_kvbench/plugin.py there")
    tasks = all_tasks(codes[0])
    print(f"full grid: {len(tasks)} tasks; load average at start {os.getloadavg()}")
    print("collect: python -m pytest -q -p no:cacheprovider bench/ --collect-only --kvbench-tasks=<every task>")
    timings: dict[str, list[Timing]] = {}
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "test_one.py").write_text(ONE_TEST)
        variants = [(f"{code.name}: {label}", code, command, cwd) for code in codes for label, command, cwd in (
            ("one test, plugin loaded", PYTEST + ["test_one.py"], Path(folder)),
            ("one test, -p no:kvbench", PYTEST + ["-p", "no:kvbench", "test_one.py"], Path(folder)),
            ("collect the full bench grid", PYTEST + ["bench/", "--collect-only", f"--kvbench-tasks={','.join(tasks)}"],
             code))]
        for _ in range(args.rounds):
            for name, code, command, cwd in variants:
                timings.setdefault(name, []).append(measured(code, command, cwd))
    medians = print_medians(timings)
    for code in codes:
        loaded, bare, collect = (medians[f"{code.name}: {label}"] for label in (
            "one test, plugin loaded", "one test, -p no:kvbench", "collect the full bench grid"))
        print(f"{code}: unused plugin's cost {loaded.wall_s - bare.wall_s:+.2f} s wall, "
              f"{loaded.cpu_s - bare.cpu_s:+.2f} s CPU (target <= 0.15 s); full-grid collection "
              f"{collect.wall_s:.2f} s wall, {collect.cpu_s:.2f} s CPU (target <= 1.5 s)")
    print(f"load average at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
