"""The xdist controller's session ETA when workers run sharing groups (``-n N --dist loadgroup``).

With shared prefill the first item of a sharing group to run (its host) computes one forward per sample for
every item of the group and decodes them all; the group's later items only take their outcomes and finish in
about no time. The controller's old estimate, items left x mean seconds of the finished items / workers, read
that as 34 items of a few hundred seconds each: in a 15-minute ``-n 2`` run of the real-model job (one reference
group cut into two parts, one per worker: group_parts.py) it printed ``items 1/34, session ETA 3h03m`` when the
first host finished at 673 s, then fell by the second as the 0-s items finished, and still said 20m43s when the
run ended. A single process models groups (progress/eta.py); this is the same idea at the controller's grain:

* the unit is what ``--dist loadgroup`` keeps on one worker, the sharing group (a reference group or a part of
  one: group_parts.sharing_groups, the scheduler's own cut). An item whose method prefills alone (a kvpress
  press, ThinK, per_turn) stays on its group's worker but costs its own prefills and decodes;
* a running item's time left is what its worker last said of it (the snapshot: seconds per sample at the
  steady rate x samples left), which for a host is the rest of its whole group's work and for a later item
  about nothing. An item that started and has not sent a sample yet, and an item not started, is priced by
  its role: a group's first shared item (host) at the mean seconds of the finished hosts, else of the running
  hosts projected (seconds so far + time left); a later shared item at the mean of the finished later ones
  (0 before any); an item alone at the mean of the items alone, each kind falling back on the other;
* the workers: each running group holds one until its time left is over; the groups not started go, in the
  order collected, to whichever worker is free first (what loadgroup does, give or take its two groups queued
  per worker); the ETA is when the last worker is free. A group is priced whole, so three equal groups left
  on two workers read two groups' time, where dividing their sum by the workers read one and a half.

Without sharing groups (not loadgroup, sharing off, no benchmark items) the controller keeps the mean
(text.mean_item_left). Pure bookkeeping of the events given to it, no clock: the board feeds it the workers'
snapshots and the controller's item reports (start, finish with its seconds).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass
from statistics import fmean

HOST, LATER, ALONE = "host", "later", "alone"


@dataclass(frozen=True)
class Running:
    """A worker's running item as its last snapshot says (progress.SessionProgress.snapshot)."""

    item: str  # the item id
    done: int
    total: int
    per_sample: float  # seconds per sample left
    elapsed: float | None = None  # seconds the item has run (None: a worker that does not say)

    @classmethod
    def of(cls, snapshot: Mapping) -> Running | None:
        if snapshot.get("item") is None:
            return None
        return cls(snapshot["item"], snapshot["done"], snapshot["total"], snapshot["per_sample"],
                   snapshot.get("elapsed"))

    @property
    def left(self) -> float:
        return self.per_sample * max(0, self.total - self.done)

    @property
    def projected(self) -> float:
        """The whole item's seconds: so far + left (so far from the rate where the worker does not say)."""
        return (self.elapsed if self.elapsed is not None else self.per_sample * self.done) + self.left


class WorkersEstimate:
    """Seconds left of a session whose items run in sharing groups on several workers."""

    def __init__(self, groups: Mapping[str, Hashable], alone: Collection[str] = ()) -> None:
        """``groups``: item id -> its sharing group, for every item the session runs (in collection order);
        ``alone``: the items whose method prefills alone (they stay on their group's worker)."""
        self.groups = dict(groups)
        self.alone = set(alone) & set(self.groups)
        self.members: dict[Hashable, list[str]] = {}
        for item, group in self.groups.items():
            self.members.setdefault(group, []).append(item)
        self.role: dict[str, str] = {}  # started items: host, later or alone
        self.hosted: set[Hashable] = set()  # groups whose first shared item started
        self.finished: dict[str, float] = {}  # item -> seconds

    def start(self, item: str) -> None:
        """The item started (its worker's report or first snapshot, whichever comes first)."""
        if item not in self.groups or item in self.role:
            return
        group = self.groups[item]
        if item in self.alone:
            self.role[item] = ALONE
        else:
            self.role[item] = LATER if group in self.hosted else HOST
            self.hosted.add(group)

    def finish(self, item: str, seconds: float) -> None:
        if item in self.groups:
            self.start(item)
            self.finished[item] = seconds

    def remaining(self, running: Iterable[Running], workers: int) -> float | None:
        """Seconds until the last worker is free, ``running`` being the workers' running items (their latest
        snapshots); None while nothing needed is measured (no host or item alone finished or sent a sample)."""
        live = {r.item: r for r in running if r.item in self.groups and r.item not in self.finished}
        for item in live:  # a snapshot can come before the item's start report
            self.start(item)
        prices = self._prices(live)
        busy, waiting = [], []
        for group, members in self.members.items():
            if all(item in self.finished for item in members):
                continue
            left = self._group_left(group, members, live, prices)
            if left is None:
                return None
            (busy if any(item in self.role or item in live for item in members) else waiting).append(left)
        free = sorted(busy) + [0.0] * max(0, max(workers, 1) - len(busy))
        heapq.heapify(free)
        for cost in waiting:  # each group not started to the worker free first
            heapq.heapreplace(free, free[0] + cost)
        return max(free) if free else 0.0

    def _prices(self, live: Mapping[str, Running]) -> dict[str, float | None]:
        """What an item of each role costs that has not sent a sample: the mean of the finished items of
        that role, else of the running ones projected; hosts and items alone fall back on each other."""

        def mean(role: str) -> float | None:
            seconds = [s for item, s in self.finished.items() if self.role[item] == role] or [
                r.projected for item, r in live.items() if self.role[item] == role]
            return fmean(seconds) if seconds else None

        host, alone, later = mean(HOST), mean(ALONE), mean(LATER)
        return {HOST: host if host is not None else alone, ALONE: alone if alone is not None else host,
                LATER: later or 0.0}

    def _group_left(self, group: Hashable, members: list[str], live: Mapping[str, Running],
                    prices: Mapping[str, float | None]) -> float | None:
        left = 0.0
        hosted = group in self.hosted
        for item in members:
            if item in self.finished:
                continue
            if item in live:
                left += live[item].left
                continue
            if item in self.role:  # started, no sample yet
                role = self.role[item]
            elif item in self.alone:
                role = ALONE
            else:  # the group's first shared item to start is its host
                role, hosted = (LATER if hosted else HOST), True
            price = prices[role]
            if price is None:
                return None
            left += price
        return left
