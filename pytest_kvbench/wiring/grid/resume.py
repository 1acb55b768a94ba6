"""Which run ``--kvbench-resume`` may continue: one under the results directory, with the same settings.

Resuming appends records to an existing run directory, so a wrong target does damage: a path
given as a run id would scatter run files into any directory, and records made with other
settings (samples, protocol, budgets, ...) would end up in one run.json as if they were
comparable, which ``kvbench merge`` itself refuses. So the target must be a run id (or unique
prefix, or ``latest``) of a run under ``<results>/runs/``, and the grid must equal the one the
run recorded in its settings file when its first record was written; otherwise the command
stops with a one-line reason before any model loads.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pytest_kvbench.cases import Grid, GridError
from pytest_kvbench.results.run import storage
from pytest_kvbench.results.run.directories import RunError, resolve_run_dir, runs_dir
from pytest_kvbench.results.run.lock import held_by_another
from pytest_kvbench.user_paths import inside, shown


def resume_target(run_id: str, results_dir: Path) -> Path:
    """The run directory that ``--kvbench-resume run_id`` names; GridError if it is not one of ours."""
    what = f"--kvbench-resume {shown(run_id)}"
    if not run_id.strip() or "/" in run_id or os.sep in run_id or run_id.strip(".") == "" or "\x00" in run_id:
        raise GridError(f"{what}: give a run id under {runs_dir(results_dir)} (see `kvbench list`), not a path")
    try:
        path = resolve_run_dir(run_id, results_dir)
    except (RunError, OSError) as exc:
        raise GridError(f"{what}: {exc}") from None
    if not inside(path, runs_dir(results_dir)):
        raise GridError(f"{what}: {path} is not a run under {runs_dir(results_dir)}")
    return path


def recorded_settings(run_dir: Path) -> dict | None:
    """The grid a run was made with: its settings file, else (older runs) its run.json."""
    for name, inner in ((storage.SETTINGS_FILE, None), (storage.RUN_FILE, "grid")):
        path = run_dir / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise GridError(f"--kvbench-resume: {path} cannot be read ({exc})") from None
        data = data.get(inner) if inner and isinstance(data, dict) else data
        if isinstance(data, dict):
            return data
    return None


def settings_changes(before: dict, grid: Grid) -> list[str]:
    """Each grid setting that differs from the run's, as ``name: old -> new``."""
    now = json.loads(json.dumps(grid.as_dict()))
    return [f"{name}: {before.get(name)!r} -> {now[name]!r}" for name in now
            if json.dumps(before.get(name), sort_keys=True) != json.dumps(now[name], sort_keys=True)]


def check_resume(run_id: str, results_dir: Path, grid: Grid) -> str:
    """The run id to resume, after checking the target and that the settings did not change."""
    path = resume_target(run_id, results_dir)
    holder = held_by_another(path)  # before anything else about the run: what it holds may be changing
    if holder is not None:
        raise GridError(f"--kvbench-resume {shown(run_id)}: run {path.name} is in use by {holder}; wait for it to "
                        f"end (or stop it) and try again")
    before = recorded_settings(path)
    if before is None and not (path / storage.RECORDS_FILE).exists() and not (path / storage.RUN_FILE).exists():
        return path.name  # started, no item finished (only its lock files): nothing a new grid could mix with
    if before is None:
        raise GridError(f"--kvbench-resume {path.name}: the run records no settings, so a resume cannot be "
                        f"checked to measure the same thing; start a new run")
    changes = settings_changes(before, grid)
    if changes:
        raise GridError(f"--kvbench-resume {path.name}: the settings differ from the run's ({'; '.join(changes)}); "
                        f"resume with the run's settings, or start a new run")
    return path.name


def repair_before_running(run_dir: Path) -> None:
    """A damaged run (results/run/state.py) is repaired once its lock is held, before any item runs, and the
    repair is one line on stderr (results/run/repair.py)."""
    from pytest_kvbench.results.run.repair import repair  # lazy for startup time: resumes only

    line = repair(run_dir)
    if line:
        sys.stderr.write(line + "\n")
