"""Which tasks run from the data packaged with pytest-kvbench (``--kvbench-data fixtures``), offline.

Why: a keyword or marker the user names (``-k qasper``, ``-m infinitebench``) brings every task of the registry
it names into the grid (wiring/grid/named_tasks.py), but on the packaged fixtures only some tasks have data: LongBench
ships 7 of its files, RULER's qa tasks read SQuAD / HotpotQA from the hub. Bringing in a task that can only
fail would turn a selection into a wall of errors; this answers without reading or importing any data.
"""

from __future__ import annotations

from .registry import get_task


def has_packaged_data(name: str) -> bool:
    """The task (a registry name, settings allowed) can load its samples from the packaged fixtures."""
    task = get_task(name)
    spec = task.spec
    if task.suite == "ruler":  # generated; the haystacks need only the packaged essay, qa needs a hub corpus
        return getattr(spec, "needs", None) not in ("squad", "hotpotqa")
    if task.suite == "longbench":
        from .longbench.data import fixture_tasks  # lazy: the suite's data module (no heavy import)

        return spec.name in fixture_tasks()
    if task.suite == "longbench_v2":
        return True  # data.json holds both variants (direct and CoT)
    data_file = getattr(spec, "data_file", None)
    source = _suite_data(task.suite)
    return data_file is not None and source is not None and data_file in source.fixture_files()


def _suite_data(suite: str):
    """The suite's SuiteData (infinitebench, reasoning, scbench), or None for a suite without one."""
    import importlib  # lazy: only the suite whose task was asked about

    try:
        return importlib.import_module(f"{__package__}.{suite}.task").DATA
    except (ImportError, AttributeError):
        return None
