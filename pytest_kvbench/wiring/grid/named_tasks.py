"""Tasks a ``-k`` or ``-m`` expression names: they join the grid, so the selection can find them.

Why: without a task list the grid holds the default tasks (tasks/registry.py), and pytest's ``-k`` / ``-m``
only choose among the items collected. So ``pytest bench/ -k "snapkv and qasper"``, the example users copy
first, collected nothing ("no tests ran", exit 5): qasper is not a default task. A name the user writes in
the expression now brings the registry's tasks it names into the grid; the expression then selects as usual:

* an identifier that is a suite (``-m infinitebench``, ``-k ruler``: suites are markers, and markers are
  keywords) names every task of that suite;
* a ``-k`` identifier names each task whose name contains it or that it contains (``-k qasper``, ``-k niah``,
  ``-k snapkv-128-qasper``), as pytest's case-insensitive substring match would find that task's items.

Identifiers naming no task (``snapkv``, ``smoke``) add nothing, so ``-m smoke`` and ``-k snapkv`` run what they
ran before. Only tasks that can run are added: their suite's optional dependency installed, and, on the
packaged fixtures (the embedded model's data), data in the package (tasks/packaged.py); RULER's qa tasks
and LongBench's unpackaged files need ``--kvbench-data`` or the hub (offline with nothing cached, the qa tasks are
not added: they could only skip, and ``pytest bench/ -m ruler`` selects the 11 RULER tasks that run offline).
A task list (``--kvbench-tasks``) is the grid as given: nothing is added to it.
"""

from __future__ import annotations

import re

from pytest_kvbench.tasks import registry
from pytest_kvbench.tasks.packaged import has_packaged_data
from pytest_kvbench.tasks.ruler.external import QA_FILES, qa_corpus_reachable

# pytest's expression words (-k and -m share the grammar); what is left are the identifiers the user wrote
_OPERATORS = {"and", "or", "not", "true", "false"}
_IDENTIFIER = re.compile(r"[^\s()]+")


def identifiers(expression: str | None) -> list[str]:
    """The names in a -k / -m expression, lower-cased; a marker's arguments (``m(x=1)``) dropped."""
    text = re.sub(r"\([^()]*=[^()]*\)", " ", expression or "")  # -m 'marker(key=value)'
    return [word.lower() for word in _IDENTIFIER.findall(text) if word.lower() not in _OPERATORS]


def tasks_named(keyword: str | None, markexpr: str | None) -> list[str]:
    """The registry's tasks the expressions name, in registry order (whether they can run here aside)."""
    suites = {suite: registry.available_tasks(suite) for suite in registry.SUITES}
    keywords, markers = identifiers(keyword), identifiers(markexpr)
    named: set[str] = set()
    for word in keywords + markers:
        named.update(suites.get(word, ()))
    for word in keywords:
        named.update(task for task in registry.available_tasks() if word in task.lower() or task.lower() in word)
    return [task for task in registry.available_tasks() if task in named]


def runnable(task: str, on_fixtures: bool, data_dir=None) -> bool:
    """The task's suite dependency is installed and, on the packaged fixtures, its data is packaged; elsewhere a
    RULER qa task's corpus can be had (the data directory's file, the hub, or a cached copy when offline)."""
    if registry.missing_dependency(registry.suite_of(task)) is not None:
        return False
    if on_fixtures:
        return has_packaged_data(task)
    needs = getattr(registry.get_task(task).spec, "needs", None)
    return qa_corpus_reachable(needs, data_dir) if needs in QA_FILES else True


def added_tasks(keyword: str | None, markexpr: str | None, grid_tasks: list[str],
                on_fixtures: bool, data_dir=None) -> tuple[list[str], list[str]]:
    """(the tasks to add to a default grid: named by -k / -m, runnable here, not already in it by base name;
    the named tasks that cannot run here, for the run header to say so rather than collect nothing)."""
    present = {task.split(":", 1)[0] for task in grid_tasks}
    named = [task for task in tasks_named(keyword, markexpr) if task not in present]
    return ([task for task in named if runnable(task, on_fixtures, data_dir)],
            [task for task in named if not runnable(task, on_fixtures, data_dir)])


def header_lines(added: list[str], unavailable: list[str]) -> list[str]:
    """What the run header says about tasks named by -k / -m (nothing when none were)."""
    lines = []
    if added:
        lines.append(f"kvbench: -k / -m name tasks outside the default grid, added: {', '.join(added)}")
    if unavailable:
        lines.append(f"kvbench: -k / -m name tasks that cannot run here, not added: {', '.join(unavailable)} (their data is "
                     "not packaged, or offline and not cached, or their suite's extra is missing: `kvbench tasks`; "
                     "give --kvbench-data DIR)")
    return lines
