"""The session's remaining time when items share their prefill: a cost model of reference groups.

With shared prefill (engine/shared_prefills.py) the first item of a reference group to run computes one
prefill per sample for every item of its group and decodes them all; the group's later items only take
their outcomes and score. So items cost very different amounts: in the default job a niah group's first
item runs ~100 s and each of its 14 others well under a second, and groups differ by their prompts (2,048
tokens for RULER, a few hundred for some fixtures) and sample counts. Items left x mean item duration was
wrong by 20x: it showed 12 s left at item 105 of 180 with minutes to go.

What is known before an item runs: its reference group, how many planned items the group has (the first
one decodes them all), the samples asked for and, for RULER, the prompt length. What is measured: each
finished first item's seconds, samples and prompt tokens, the later items' seconds, and the running item's
seconds per sample. The estimate:

* the running item: its seconds per sample x samples left (before its first sample: as a group below);
* a group not started: members x samples x the seconds per (member, sample) of the first items measured
  so far (the running one projected from its samples), each scaled by the ratio of prompt lengths where
  both are known; samples not known in advance are the mean measured so far;
* a later item of a started group: the mean of later items measured so far;
* an item that prefills alone (its own group: a method that cannot share a forward, such as a kvpress press
  or ThinK, or any item with sharing off) pays a prefill per sample, not a group member's share of one: it
  is priced at the items alone measured so far, per sample and prompt token; before any, at a whole group's
  first item per sample (one prefill per sample and the group's decoding: an upper bound). A group before any
  group was measured is priced the other way round, at an item alone per sample. Pricing an item alone at a
  group member's share showed "session ETA 1s" with kvzip items of a minute each left.

Pure bookkeeping with the times given to it: the caller owns the clock (tests use a fake one).
`scripts/measure/measure_progress_eta.py` replays a finished run through it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from statistics import fmean


@dataclass(frozen=True)
class PlannedItem:
    key: str  # the item (Case.key)
    group: Hashable  # the items of one group share a prefill (the item's own key when it prefills alone)
    samples: int | None = None  # samples asked for (None: all the task has)
    prompt_tokens: int | None = None  # known in advance for RULER (its context length)


@dataclass(frozen=True)
class _Measured:
    seconds: float
    members: int
    samples: int
    prompt_tokens: float | None  # None: not known (a running item of a task without a fixed length)

    def cost(self, members: int, samples: float, prompt_tokens: float | None) -> float:
        """What a group of ``members`` x ``samples`` of ``prompt_tokens`` tokens costs at this group's rate;
        scaled by the prompt length when both lengths are known."""
        per_member_sample = self.seconds / max(1, self.members * self.samples)
        scale = prompt_tokens / self.prompt_tokens if prompt_tokens and self.prompt_tokens else 1.0
        return members * samples * per_member_sample * scale

    def per_sample(self, samples: float, prompt_tokens: float | None) -> float:
        """What ``samples`` samples of ``prompt_tokens`` tokens cost at this item's whole rate per sample."""
        return self.cost(self.members, samples, prompt_tokens)


def _alone(item: PlannedItem) -> bool:
    return item.group == item.key


class GroupedEstimate:
    """Remaining seconds of the planned items, from what finished and what runs."""

    def __init__(self, planned: Sequence[PlannedItem]) -> None:
        self.planned = {item.key: item for item in planned}
        self.members = Counter(item.group for item in planned)
        self.started: set[Hashable] = set()  # groups whose first item ran or runs
        self.first_of: dict[str, bool] = {}  # started items: whether each was its group's first
        self.finished: set[str] = set()
        self.firsts: list[_Measured] = []  # first items of groups that share a prefill
        self.alone: list[_Measured] = []  # items that prefilled alone
        self.later: list[float] = []  # seconds of the groups' later items

    def start(self, key: str) -> None:
        item = self.planned.get(key)
        if item is not None and key not in self.first_of:
            self.first_of[key] = item.group not in self.started
            self.started.add(item.group)

    def finish(self, key: str, seconds: float, samples: int = 0, prompt_tokens: float = 0.0) -> None:
        """An item ended after ``seconds``, having run ``samples`` samples of ``prompt_tokens`` tokens on average."""
        item = self.planned.get(key)
        if item is None:
            return
        self.start(key)
        self.finished.add(key)
        if not self.first_of[key]:
            self.later.append(seconds)
        elif samples > 0:
            measured = _Measured(seconds, self.members[item.group], samples, prompt_tokens or item.prompt_tokens)
            (self.alone if _alone(item) else self.firsts).append(measured)

    def remaining(self, running: str | None = None, done: int = 0, total: int = 0,
                  elapsed: float = 0.0) -> float | None:
        """Seconds left for every planned item not finished, ``running`` having done ``done`` of its
        ``total`` samples in ``elapsed`` seconds; None before anything was measured."""
        item = self.planned.get(running) if running is not None else None
        first = item is not None and self.first_of.get(running, False)
        firsts, alone = list(self.firsts), list(self.alone)
        projected = elapsed / done * total if item is not None and done and total else None
        if first and projected is not None:
            (alone if _alone(item) else firsts).append(_Measured(projected, self.members[item.group], total,
                                                                 item.prompt_tokens))
        if not firsts and not alone and not self.later:
            return None
        later = fmean(self.later) if self.later else 0.0

        def group_cost(planned: PlannedItem, samples: float | None = None) -> float:
            if not firsts and not alone:
                return later * self.members[planned.group]
            samples = samples or planned.samples or fmean(m.samples for m in firsts + alone)
            if _alone(planned) and alone or not _alone(planned) and firsts:  # priced at its own kind
                return fmean(m.cost(self.members[planned.group], samples, planned.prompt_tokens)
                             for m in (alone if _alone(planned) else firsts))
            return fmean(m.per_sample(samples, planned.prompt_tokens) for m in firsts + alone)

        if projected is not None:
            left = projected - elapsed
        elif first:
            left = max(0.0, group_cost(item, total) - elapsed)
        else:
            left = max(0.0, later - elapsed) if item is not None else 0.0
        counted: set[Hashable] = set()
        for key, planned in self.planned.items():
            if key in self.finished or key == running:
                continue
            if planned.group in self.started:
                left += later
            elif planned.group not in counted:
                counted.add(planned.group)
                left += group_cost(planned)
        return left
