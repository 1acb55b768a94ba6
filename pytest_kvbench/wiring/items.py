"""From a pytest item or node id back to the benchmark case it runs.

Benchmark items are parametrized with one `Case` each (``file::test[item id]``, item_ids.py); the hooks that see
only an item (makereport, collection) or only a node id (xdist's collection and crash reports) look
the case up here. Other tests in the same session map to None.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from pytest_kvbench.cases import Case
from pytest_kvbench.results.run.lock import RunInUse
from pytest_kvbench.wiring.interrupts import honour_sigint, honour_sigterm
from pytest_kvbench.wiring.item_ids import item_ids
from pytest_kvbench.wiring.stash_keys import SESSION_KEY

def is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def case_of(item: pytest.Item) -> Case | None:
    callspec = getattr(item, "callspec", None)
    case = callspec.params.get("kvbench_case") if callspec else None
    return case if isinstance(case, Case) else None


def is_empty_case_item(item: pytest.Item) -> bool:
    """pytest's placeholder item for a suite with no case in the grid."""
    return "kvbench_case" in getattr(item, "fixturenames", ()) and case_of(item) is None


def case_of_nodeid(config: pytest.Config, nodeid: str) -> Case | None:
    """The case behind a benchmark item's node id; None for other tests."""
    if not nodeid.endswith("]") or "[" not in nodeid:
        return None
    return item_ids(config).cases.get(nodeid.rsplit("[", 1)[1][:-1])


def expect(config: pytest.Config, nodeids: Iterable[str]) -> None:
    """Controller: these items are what the run must finish (a run missing any is incomplete). Before the
    first of them runs, the run directory is locked, Ctrl-C and SIGTERM honoured (wiring/interrupts.py) and the run's start
    written (its items and provenance: RunSession.write_start)."""
    run = config.stash.get(SESSION_KEY, None)
    if run is not None and run.is_controller:
        ids = item_ids(config).by_key
        run.expect((case, ids[case.key], nodeid) for nodeid in nodeids
                   if (case := case_of_nodeid(config, nodeid)) is not None)
        if run.expected and not config.option.collectonly:
            honour_sigint()
            honour_sigterm()
            lock_run(config)
            run.write_start()


def lock_run(config: pytest.Config, what: str = "") -> None:
    """Controller: hold the run directory's lock until pytest unconfigures; a usage error naming the holder
    when another process has it (results/run/lock.py)."""

    run = config.stash[SESSION_KEY]
    if run.lock is not None:
        return
    try:
        run.hold_lock()
    except RunInUse as exc:
        raise pytest.UsageError(f"{what}{exc}") from None
    config.add_cleanup(run.release_lock)
