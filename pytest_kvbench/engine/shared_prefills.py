"""Which items of a worker share one prefill per sample, and their compressed caches until they run.

Items of one reference group (model, task, context length, seed: `Case.reference_group`) run the
same prompts. The first of them to reach a sample computes one prefill (kvmethods.shared_prefill)
for the full-cache reference and every planned item of the group that has not run yet; the other
items' budget-sized caches wait here, keyed by (case key, sample id), and are handed out once
(`take`) and dropped when their item ends (`finish`), whether it passed or failed.

The plan is the worker's selected items (after -k, --lf, shards, resume). Under xdist only
`--dist loadgroup` guarantees that a group's items reach the same worker, so other schedules plan
nothing: an item then shares its prefill only with the reference, and results are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from pytest_kvbench.wiring.grid import Case


@dataclass
class PreparedPrompt:
    """One item's compressed prompt for one sample, from a shared prefill."""

    state: Any  # kvmethods.generation.PrefilledPrompt
    shared_s: float  # the shared forward (spent once for the whole group)
    own_s: float  # this item's own compression (+ its uncompressed question pass)


class SharedPrefills:
    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._planned: dict[tuple, list[Case]] = {}
        self._waiting: dict[tuple[str, str], PreparedPrompt] = {}
        self._finished: set[str] = set()

    def plan(self, cases: Iterable[Case]) -> None:
        """The items this worker will run, in any order."""
        self._planned = {}
        for case in cases:
            self._planned.setdefault(case.reference_group, []).append(case)

    def members(self, case: Case, sample_id: str, shares: Callable[[Case], bool]) -> list[Case]:
        """The items whose cache for this sample a prefill run now should make: `case` first, then
        the planned, unfinished, sharing items of its group that have none waiting."""
        others = [c for c in self._planned.get(case.reference_group, []) if c.key != case.key and shares(c)
                  and c.key not in self._finished and (c.key, sample_id) not in self._waiting]
        return [case] + others if self.enabled else [case]

    def keep(self, case: Case, sample_id: str, prepared: PreparedPrompt) -> None:
        self._waiting[(case.key, sample_id)] = prepared

    def take(self, case: Case, sample_id: str) -> PreparedPrompt | None:
        return self._waiting.pop((case.key, sample_id), None)

    def finish(self, case: Case) -> None:
        """The item ended: what still waits for it is freed."""
        self._finished.add(case.key)
        for key in [k for k in self._waiting if k[0] == case.key]:
            del self._waiting[key]

    def waiting_count(self) -> int:
        return len(self._waiting)
