"""``kvbench clean RUN``: remove a run that never finished an item.

A run killed as it started leaves a folder with only its lock files (or its first run.json and settings); it is
listed as ``started, no item finished`` and can be resumed (``--kvbench-resume``) or removed here. A run that
holds any record is refused (its results are the point of it), and so is one another process holds.
"""

from __future__ import annotations

import shutil

from pytest_kvbench.cli_checks import UsageError
from pytest_kvbench.results.run.directories import load_run, runs_dir
from pytest_kvbench.results.run.lock import held_by_another
from pytest_kvbench.user_paths import inside


def cmd_clean(args) -> int:
    run = load_run(args.run, args.results)
    if run.records:
        raise UsageError(f"run {run.run_id} holds {len(run.records)} record(s); clean removes only a run with no "
                         f"finished item (resume it with --kvbench-resume {run.run_id}, or delete {run.path} yourself)")
    if not inside(run.path, runs_dir(args.results)):
        raise UsageError(f"{run.path} is not a run under {runs_dir(args.results)}")
    holder = held_by_another(run.path)
    if holder is not None:
        raise UsageError(f"run {run.run_id} is in use by {holder}; wait for it to end (or stop it) and try again")
    shutil.rmtree(run.path)
    print(f"removed {run.path} ({run.state.label()})")
    return 0


def add_parser(sub, common) -> None:
    p = sub.add_parser("clean", parents=[common], help="remove a run that finished no item (started, then killed)")
    p.add_argument("run", metavar="RUN")
    p.set_defaults(func=cmd_clean)
