"""The session's remaining time when items share their prefill: a cost model of reference groups.

With shared prefill (engine/sample_outcomes.py) the first item of a reference group to run computes one
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

Batched decoding (docs/batched-decoding.md) changes what a group's sample costs: its first sample decodes every
member alone (each method's own decode speed is measured there), the later ones decode the members together
in one batched forward per step, so a later sample costs about one prefill and one batched decode whatever the
member count, and far less than the first. Projecting the first sample's rate over the item (or pricing a
group per member and sample) overestimated the real-model job several times over. So the running item reports
each sample's seconds and whether the members decoded for it shared a batch (`sample`); from the first batched
sample on, the item's rate is the mean of those samples (the steady rate), the samples before it (the opening)
count once. A group not started is priced the same way from a measured first item: its opening scaled by the
members (alone, each member decodes on its own), its later samples at the steady rate, not scaled by the
members (a batch reads the weights once per step; the prefill does not depend on them). Items that decoded no
batch (``--kvbench-decode-batch 1``, items alone, groups of one member) keep the per-member rate above.
Batching across samples fits the same rule once it is told how many samples a batch decoded (`covers`): the
sample that decoded the members of k samples at once counts as k samples of a k-th of its seconds each, and
the k - 1 samples after it, which find their members decoded, are already counted. Averaged as they came
instead, the one long sample read as the steady rate: in a `-n 2` real-model run a part's host decoded 21
samples' members in one batch after 21 prefills, 508 s, and its line said `2/30 508.4 s/sample ETA 3h57m`
with 4 minutes left.

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
class Batching:
    """How a first item's samples went under batched decoding: the samples before its first batched one
    (the opening: its members decoded alone) and the mean seconds of the samples from there on."""

    opening_samples: int
    opening_seconds: float
    steady: float  # seconds per sample once the members decode in batches

    @classmethod
    def of(cls, samples: Sequence[tuple[float, bool]]) -> Batching | None:
        """From (seconds, batched) per sample done; None while no sample decoded a batch."""
        first = next((i for i, (_, batched) in enumerate(samples) if batched), None)
        if first is None:
            return None
        return cls(first, sum(s for s, _ in samples[:first]), fmean(s for s, _ in samples[first:]))

    def total(self, samples: float) -> float:
        """What ``samples`` samples of this item cost: the opening once, the rest at the steady rate."""
        return self.opening_seconds + max(0.0, samples - self.opening_samples) * self.steady


@dataclass(frozen=True)
class _Measured:
    seconds: float
    members: int
    samples: int
    prompt_tokens: float | None  # None: not known (a running item of a task without a fixed length)
    batching: Batching | None = None  # None: no sample decoded a batch (members decoded one by one)

    def cost(self, members: int, samples: float, prompt_tokens: float | None) -> float:
        """What a group of ``members`` x ``samples`` of ``prompt_tokens`` tokens costs at this group's rate;
        scaled by the prompt length when both lengths are known. Batched: the opening per member, the
        later samples at the steady rate whatever the members (the module's docstring)."""
        scale = prompt_tokens / self.prompt_tokens if prompt_tokens and self.prompt_tokens else 1.0
        batching = self.batching
        if batching is not None:
            opening = min(samples, batching.opening_samples)
            opening_cost = (batching.opening_seconds / max(1, batching.opening_samples * self.members)
                            * members * opening)
            return (opening_cost + max(0.0, samples - opening) * batching.steady) * scale
        per_member_sample = self.seconds / max(1, self.members * self.samples)
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
        self.samples: dict[str, list[tuple[float, bool]]] = {}  # running items: (seconds, batched) per sample
        self.ahead: Counter[str] = Counter()  # running items: samples a batch across samples already counted

    def start(self, key: str) -> None:
        item = self.planned.get(key)
        if item is not None and key not in self.first_of:
            self.first_of[key] = item.group not in self.started
            self.started.add(item.group)

    def sample(self, key: str, seconds: float, batched: bool = False, covers: int = 1) -> None:
        """The running item finished a sample in ``seconds``; ``batched``: members decoded for it shared a batch;
        ``covers``: the samples whose members that decoded (more than 1: a batch across samples, see above)."""
        if key not in self.planned:
            return
        if self.ahead[key] and covers == 1:  # its members came with an earlier sample's batch, counted there
            self.ahead[key] -= 1
            return
        self.samples.setdefault(key, []).extend([(seconds / covers, batched)] * covers)
        self.ahead[key] = covers - 1

    def batching(self, key: str) -> Batching | None:
        """The running item's samples so far, once one decoded a batch (else None)."""
        return Batching.of(self.samples.get(key, []))

    def projected(self, key: str, done: int, total: int, elapsed: float) -> float | None:
        """The whole item's seconds, projected from its ``done`` samples of ``total`` in ``elapsed``: once a sample
        decoded a batch, ``elapsed`` and the samples left at the steady rate, less those a batch across samples
        already decoded; else at the mean rate; None before a sample is done."""
        if not done or not total:
            return None
        batching = self.batching(key)
        if batching is None:
            return elapsed / done * total
        return elapsed + max(0, total - done - self.ahead[key]) * batching.steady

    def finish(self, key: str, seconds: float, samples: int = 0, prompt_tokens: float = 0.0) -> None:
        """An item ended after ``seconds``, having run ``samples`` samples of ``prompt_tokens`` tokens on average."""
        item = self.planned.get(key)
        if item is None:
            return
        self.start(key)
        self.finished.add(key)
        batching = Batching.of(self.samples.pop(key, []))
        self.ahead.pop(key, None)
        if not self.first_of[key]:
            self.later.append(seconds)
        elif samples > 0:
            measured = _Measured(seconds, self.members[item.group], samples, prompt_tokens or item.prompt_tokens,
                                 batching)
            (self.alone if _alone(item) else self.firsts).append(measured)

    def remaining(self, running: str | None = None, done: int = 0, total: int = 0,
                  elapsed: float = 0.0) -> float | None:
        """Seconds left for every planned item not finished, ``running`` having done ``done`` of its
        ``total`` samples in ``elapsed`` seconds; None before anything was measured."""
        item = self.planned.get(running) if running is not None else None
        first = item is not None and self.first_of.get(running, False)
        firsts, alone = list(self.firsts), list(self.alone)
        projected = self.projected(running, done, total, elapsed) if item is not None else None
        if first and projected is not None:
            (alone if _alone(item) else firsts).append(_Measured(projected, self.members[item.group], total,
                                                                 item.prompt_tokens, self.batching(running)))
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
            left = max(0.0, projected - elapsed)
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
