"""Which items of a worker share one prefill per sample, and what each got from it until it runs.

Items of one reference group (model, task, context length, seed, protocol: `Case.reference_group`)
run the same prompts. The first of them to reach a sample computes one prefill (kvmethods.runtime.shared_prefill)
for the full-cache reference and every planned item of the group that has not run yet, and decodes
each of those items' compressed caches right away (engine/group_decode.py): what waits here is the
small outcome of each (item, sample), `DecodedSample` (tokens, KL, agreement, timings, sizes; no cache
and no vocabulary-sized log-probs), or what failed that item. So between samples a worker holds no
compressed cache at all, and while a sample is in flight at most its group's caches.

An item takes its outcomes once (`take`), re-raising what failed it where it failed; what is left
for an item is dropped when it ends (`finish`), whether it passed or failed. Time spent decoding an
item's samples inside another item's run is booked to it (`spent`), and both sides are counted for the
record's `meter_scope`.

The plan is the worker's selected items (after -k, --lf, shards, resume). Under xdist only
`--dist loadgroup` guarantees that a group's items reach the same worker, so other schedules plan
nothing: an item then shares its prefill only with the reference, and results are the same. With more
workers than groups a group is cut into parts (wiring/distributed/group_parts.py), and the plan shares
within each part.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_kvbench.cases import MEASURE_ALONE, Case


@dataclass
class DecodedSample:
    """One item's compressed generation of one sample, decoded right after the group's shared prefill."""

    result: Any  # kvmethods.runtime.generation.GenerationOutput, its target_logprobs dropped
    kl: float
    agreement: float
    timing: dict  # shared_prefill_ms (the group's forward), compression_ms (this item's own part), decode_batch
    host: str  # the key of the item whose run decoded it
    decode_kl: float | None = None  # KL along its own greedy decode (engine/fidelity.py)


def alone_key(case: Case, measure_alone: str = MEASURE_ALONE[0]) -> tuple:
    """What one sample decoded alone (batch 1) measures the own decode speed of (--kvbench-measure-alone).

    ``item``: the item itself, so every item's first sample is decoded alone. ``method``: the method at its budget
    on its model, context length, protocol and sliding policy, in this worker. A decoding step's cost follows the
    cache it reads (its length, its layout), not the task's words: at one context length every task's prompt is
    about as long, so the real-model jobs (8 tasks a length) measure each method's speed once a worker, where one
    sample alone per item took about a quarter of a member's decoding on gemma3-270m at 8k
    (docs/performance.md). Items without a sample alone record no ``decode_tokens_per_s_alone``."""
    if measure_alone == "method":
        return (case.model, case.method.label, case.budget.spec, case.context_length, case.protocol, case.sliding)
    return (case.key,)


class SharedPrefills:
    def __init__(self, enabled: bool = True, measure_alone: str = MEASURE_ALONE[0]) -> None:
        self.enabled = enabled
        self.measure_alone = measure_alone  # --kvbench-measure-alone: alone_key
        self._planned: dict[str, list[Case]] = {}
        self._group_of: dict[str, str] = {}  # case key -> its sharing group (its reference group, or a part of it)
        self._decoded: dict[tuple[str, str], DecodedSample] = {}
        self._failed: dict[str, tuple[str, BaseException, int]] = {}  # case key -> (sample id, what it raised, order)
        self._finished: set[str] = set()
        self._spent: Counter[str] = Counter()  # seconds of an item's decoding done in other items' runs
        self._hosted: Counter[str] = Counter()  # other items' sample decodes run inside an item's run
        self._elsewhere: Counter[str] = Counter()  # an item's own sample decodes run inside another's
        self._alone: set[tuple] = set()  # alone_key of the items with a sample decoded alone (own speed measured)
        self._batches: dict[str, list[int]] = {}  # by host: decode_batch of each (member, sample) it decoded
        self._batch_samples: dict[str, set[str]] = {}  # by host: the samples whose members it decoded

    def plan(self, cases: Iterable[Case], groups: Mapping[str, str] | None = None) -> None:
        """The items this worker will run, in any order; `groups`: each case key's sharing group when the
        reference groups are cut into parts (group_parts.sharing_groups), else each its reference group."""
        self._planned, self._group_of = {}, {}
        for case in cases:
            self._group_of[case.key] = group = (groups or {}).get(case.key, case.reference_group)
            self._planned.setdefault(group, []).append(case)

    def members(self, case: Case, sample_id: str) -> list[Case]:
        """The items a prefill of this sample run now should serve: `case` first, then the planned items
        of its group, those that have not ended, failed or got this sample already."""
        planned = self._planned.get(self._group_of.get(case.key, case.reference_group), [])
        group = [case] + [c for c in planned if c.key != case.key]
        members = [c for c in group if c.key not in self._finished and c.key not in self._failed
                   and (c.key, sample_id) not in self._decoded]
        return members if self.enabled else members[:1]

    def keep(self, case: Case, sample_id: str, decoded: DecodedSample) -> None:
        self._decoded[(case.key, sample_id)] = decoded
        if decoded.timing.get("decode_batch", 1) == 1:
            self._alone.add(alone_key(case, self.measure_alone))
        if decoded.host != case.key:
            self._hosted[decoded.host] += 1
        self._batches.setdefault(decoded.host, []).append(decoded.timing.get("decode_batch", 1))
        self._batch_samples.setdefault(decoded.host, set()).add(sample_id)

    def decoded_batches(self, host: Case) -> tuple[int, ...]:
        """What `host`'s run decoded since last asked: each (member, sample)'s `decode_batch` (1: alone).
        The progress line says it, and the ETA tells a sample whose members shared a batch from one whose
        members decoded alone (wiring/progress/eta.py)."""
        return tuple(self._batches.pop(host.key, ()))

    def decoded_samples(self, host: Case) -> int:
        """How many samples' members `host`'s run decoded since last asked: more than one when a batch across
        samples decoded the members of the samples ahead too, which the ETA then counts as paid for."""
        return len(self._batch_samples.pop(host.key, ()))

    def measured_alone(self, case: Case) -> bool:
        """Whether a sample of the item (or of its method, under ``method``: alone_key) was decoded alone (batch 1)
        already: its own decode speed is measured."""
        return alone_key(case, self.measure_alone) in self._alone

    def fail(self, case: Case, sample_id: str, error: BaseException, order: int = 0) -> None:
        """`case` failed on this sample while another item's run decoded it: raised when `case` gets there. Of
        several samples decoded together (batching across samples) the earliest failure (`order`: the sample's
        place in the item's list) is the one the item reaches first, so it is kept."""
        held = self._failed.get(case.key)
        if held is None or order < held[2]:
            self._failed[case.key] = (sample_id, error, order)

    def book(self, case: Case, seconds: float) -> None:
        """Seconds of `case`'s own work done inside another item's run (its time limit counts them)."""
        self._spent[case.key] += seconds

    def spent(self, case: Case) -> float:
        return self._spent[case.key]

    def take(self, case: Case, sample_id: str) -> DecodedSample | None:
        """This item's outcome of the sample (once); raises what failed the item on this sample."""
        decoded = self._decoded.pop((case.key, sample_id), None)
        failed = self._failed.get(case.key)
        if decoded is None and failed is not None and failed[0] == sample_id:
            raise failed[1]
        if decoded is not None and decoded.host != case.key:
            self._elsewhere[case.key] += 1
        return decoded

    def meter_scope(self, case: Case) -> dict:
        """What the item's meter (peak memory, energy, wall time) saw beyond its own decoding: other items'
        sample decodes it ran, and its own sample decodes another item's run made."""
        return {"decoded_for_other_items": self._hosted[case.key], "decoded_in_other_items": self._elsewhere[case.key]}

    def finish(self, case: Case) -> None:
        """The item ended: what still waits for it is freed."""
        self._finished.add(case.key)
        self._failed.pop(case.key, None)
        self._batches.pop(case.key, None)
        self._batch_samples.pop(case.key, None)
        for key in [k for k in self._decoded if k[0] == case.key]:
            del self._decoded[key]

    def waiting_count(self) -> int:
        return len(self._decoded)
