"""The per-run objects the plugin keeps in pytest's config and item stashes, named once.

The plugin's hooks live in several modules (run_plugin.py, xdist_hooks.py, fixture.py, ...); they find
the run session, runner, gate and progress through these keys rather than module globals, so two
pytest sessions in one process (pytester) never share them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import pytest

# The keys' value types only (the run's own modules, beside this one). distributed/ and progress/ sit above and
# read these keys, so their types are not imported here: the xdist slots' key lives with DeviceSlots
# (distributed/gpu_slots.py), and the progress key names what the run's modules need of it (RunProgress).
if TYPE_CHECKING:
    from pytest_kvbench.wiring.gate import Gate
    from pytest_kvbench.wiring.interrupts import InterruptShield
    from pytest_kvbench.wiring.session import RunSession


class RunProgress(Protocol):
    """What the run's modules ask of the live progress (progress/live.py's SessionProgress is the one)."""

    items_total: int

    def item(self, case: Any, item_id: str | None = None) -> Any:
        """The progress of one running item, shown by its pytest id (handed to the runner; `finish(record)` when it
        ends)."""

SESSION_KEY = pytest.StashKey["RunSession"]()
RUNNER_SETTINGS_KEY = pytest.StashKey[object]()  # what the Runner is built from, at configure (runner_settings.py)
RUNNER_KEY = pytest.StashKey[object]()  # the Runner, built when the first item needs it
ENGINE_ITEMS_KEY = pytest.StashKey[object]()  # serving/engine_item.EngineItems, built when the first engine item runs
PLANNED_CASES_KEY = pytest.StashKey[list]()  # the cases this process shares prefills among (collection's)
SHARING_GROUPS_KEY = pytest.StashKey[dict]()  # their sharing groups by case key (wiring/distributed/group_parts.py)
SCHEDULED_GROUPS_KEY = pytest.StashKey[dict]()  # controller: the scheduler's sharing group of each item id
GATE_KEY = pytest.StashKey["Gate"]()
PROGRESS_KEY = pytest.StashKey[RunProgress]()
ITEM_IDS_KEY = pytest.StashKey[object]()  # item_ids.ItemIds: every case's pytest id, named once per session
RECORD_KEY = pytest.StashKey[dict]()  # item stash: the item's measured record
VERDICT_KEY = pytest.StashKey[dict]()  # item stash: the gate's verdict on it
SHIELD_KEY = pytest.StashKey["InterruptShield"]()  # holds a Ctrl-C off while the controller writes the run
INTERRUPTED_WORKERS_KEY = pytest.StashKey[set]()  # xdist workers stopped by Ctrl-C (not crashed)
ACTIVATED_LATE_KEY = pytest.StashKey[bool]()  # kvbench came in during collection (plugin.py), after the header
