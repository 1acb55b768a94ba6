"""The default selection of `pytest bench/` on the embedded model: only tasks its full cache scores on.

The embedded model is a compiled retrieval circuit; on most fixture tasks of the default grid (hotpotqa,
passkey, LongBench v2, ...) its full cache scores exactly 0, so every method scores 0 there too and those
items only add flat zero rows. Its measured full-cache scores are data next to the model
(``default_model/task_scores.toml``); items of tasks scored 0 there are deselected (pytest's
``pytest_deselected``, so pytest counts them) when the user selected nothing: no ``-m``, no ``-k``, no
task list and no protocol but the default. The plugin's collection hook deselects them (``left_out_items``)
after -k / -m and before ``--kvbench-shard`` splits what is left, so shards split what runs unsharded. Naming a task, a marker or a keyword selects from the whole grid as before, so the smoke subset
(``-m smoke``) and its baseline are unchanged; a task or suite named in ``-k`` / ``-m`` that is not in the default
grid joins it first (named_tasks.py), so ``-k qasper`` finds qasper. The run header names both.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from pytest_kvbench.cases import DEFAULT_MODEL, DEFAULT_PROTOCOL, Case, Grid
from pytest_kvbench.wiring.grid import named_tasks
from pytest_kvbench.wiring.items import case_of
from pytest_kvbench.wiring.grid.grid_file import tomllib  # the standard library's, or tomli before Python 3.11
from pytest_kvbench.wiring.stash_keys import ACTIVATED_LATE_KEY, SESSION_KEY

SCORES_FILE = Path(__file__).parents[1] / "default_model" / "task_scores.toml"


@functools.cache
def full_cache_scores() -> dict[str, float]:
    """Task name (without settings) -> the embedded model's measured full-cache score; a usage error
    naming the file when it is missing or malformed (a broken install)."""
    try:
        with open(SCORES_FILE, "rb") as handle:
            return {str(task): float(score) for task, score in tomllib.load(handle)["full_cache_scores"].items()}
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise pytest.UsageError(f"{SCORES_FILE}: cannot read the embedded model's task scores ({exc}); "
                                "reinstall pytest-kvbench") from None


def unscored_tasks() -> set[str]:
    """Tasks whose full cache scores 0 on the embedded model: out of its default selection."""
    return {task for task, score in full_cache_scores().items() if score <= 0}


def user_selected(config: pytest.Config, grid: Grid) -> bool:
    """-m, -k, a task list (option, ini key or grid file) or a protocol other than the default (it picks the
    tasks that serve it, e.g. multi_turn: SCBench's): the user chose what to run."""
    return bool(config.option.markexpr or config.option.keyword or grid.tasks_named
                or any(protocol != DEFAULT_PROTOCOL for protocol in grid.protocols))


def left_out_tasks(config: pytest.Config, grid: Grid) -> list[str]:
    """The grid's tasks that the default selection leaves out in this run (none when the user selected)."""
    if user_selected(config, grid) or DEFAULT_MODEL not in grid.models:
        return []
    return [task for task in grid.tasks if task.split(":", 1)[0] in unscored_tasks()]


def outside_default_selection(case: Case) -> bool:
    """An item of the embedded model on a task whose full cache scores 0 there."""
    return case.model == DEFAULT_MODEL and case.task.split(":", 1)[0] in unscored_tasks()


def left_out_items(config: pytest.Config, items: list[pytest.Item]) -> list[pytest.Item]:
    """The items the default selection deselects in this run (none when the user selected). Called by the
    plugin's collection hook (run_plugin.py), after -k / -m and before --kvbench-shard cuts what is left."""
    if not left_out_tasks(config, config.stash[SESSION_KEY].grid):
        return []
    return [item for item in items if (case := case_of(item)) is not None and outside_default_selection(case)]


def pytest_report_header(config: pytest.Config) -> list[str]:
    return _selection_lines(config)


def pytest_report_collectionfinish(config: pytest.Config) -> list[str]:
    """The header's lines, when kvbench came in during collection (after the header was written)."""
    return _selection_lines(config) if config.stash.get(ACTIVATED_LATE_KEY, False) else []


def _selection_lines(config: pytest.Config) -> list[str]:
    run = config.stash.get(SESSION_KEY, None)
    if run is None:
        return []
    lines = named_tasks.header_lines(run.grid.tasks_added, run.grid.tasks_unavailable)
    left_out = left_out_tasks(config, run.grid)
    if left_out:
        lines.append(f"kvbench: default selection: tasks the embedded model's full cache scores 0 on are left out "
                     f"({', '.join(left_out)}); select them with --kvbench-tasks, -m or -k")
    return lines
