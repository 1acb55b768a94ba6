"""What the plugin costs a pytest run: unused (a one-test file elsewhere) and collecting the full bench grid.

Issue 27's targets: installed but unused, the plugin adds at most 0.15 s to an unrelated pytest run (a
one-test file in a temporary folder, with vs `-p no:kvbench`); collecting the whole bench grid (every
task `kvbench tasks` lists) takes at most 1.5 s. Variants run interleaved, round after round, so the
neighbours' load falls on all alike; medians of wall and CPU seconds and the load average are printed.
`--code DIR` measures another copy of the package (e.g. `git archive main` unpacked) with the same
interpreter, for before/after figures.

    python scripts/measure_startup.py --rounds 5 [--code /tmp/kvbench-main]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from timed_run import ROOT, Timing, print_medians, timed_command

ONE_TEST = "def test_one():\n    assert 1 + 1 == 2\n"


def all_tasks(code: Path) -> list[str]:
    """Every task name, as `kvbench tasks` lists them (read from the measured code)."""
    sys.path.insert(0, str(code))
    from pytest_kvbench.tasks.registry import available_tasks

    return available_tasks()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--code", type=Path, default=ROOT, help="the copy of pytest-kvbench to measure")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    code = args.code.resolve()
    if not (code / "pytest_kvbench" / "plugin.py").is_file():
        parser.error(f"--code {code}: no pytest_kvbench/plugin.py there")
    os.environ["PYTHONPATH"] = str(code)  # the children import the measured copy, not the installed one
    tasks = ",".join(all_tasks(code))
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    collect = pytest + ["bench/", "--collect-only", f"--kvbench-tasks={tasks}", "--kvbench-torch-threads=1"]
    print(f"code: {code}; full grid: {len(tasks.split(','))} tasks; load average {os.getloadavg()}")
    print("collect command: python -m pytest -q -p no:cacheprovider bench/ --collect-only "
          "--kvbench-tasks=<every task> --kvbench-torch-threads=1")
    timings: dict[str, list[Timing]] = {"one test, plugin loaded": [], "one test, -p no:kvbench": [],
                                        "collect the full bench grid": []}
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "test_one.py").write_text(ONE_TEST)
        for _ in range(args.rounds):
            timings["one test, plugin loaded"].append(timed_command(pytest + ["test_one.py"], Path(folder)))
            timings["one test, -p no:kvbench"].append(timed_command(pytest + ["-p", "no:kvbench", "test_one.py"],
                                                                    Path(folder)))
            timings["collect the full bench grid"].append(timed_command(collect, code))
    medians = print_medians(timings)
    cost = medians["one test, plugin loaded"].wall_s - medians["one test, -p no:kvbench"].wall_s
    print(f"unused plugin's cost: {cost:+.2f} s wall (target <= 0.15 s); full-grid collection "
          f"{medians['collect the full bench grid'].wall_s:.2f} s (target <= 1.5 s); load average now {os.getloadavg()}")


if __name__ == "__main__":
    main()
