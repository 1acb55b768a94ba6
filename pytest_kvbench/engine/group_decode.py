"""A reference group's sample, decoded member by member right after its one shared prefill.

The shared prefill of a sample makes the compressed cache of every member of the group (the items
still to run). Keeping those caches until each member's item runs would hold (members - 1) x samples
caches; instead each member's compressed generation is decoded at once (teacher-forced on the
reference and compared with it there) and only its small outcome is kept (sample_outcomes.DecodedSample).
Each cache is dropped as soon as it is decoded, so a worker holds at most one sample's group of
compressed caches, and none between samples.

Members whose method and cache can batch (kvmethods.runtime.batched_generation.can_decode_in_batch) decode
together, one forward per step for the batch (`--kvbench-decode-batch`, engine/decode_batching.py), once each
was decoded alone on its first sample: that sample measures the method's own decode speed (a batch's time is
shared equally among its members, which blurs it), the record's `decode_tokens_per_s_alone`. Each sample row
says how many members its decoding shared a batch with (`decode_batch`, 1: alone) and how many samples those
members came from (`decode_batch_samples`).

Several samples' groups can decode together (`SampleGroup`s, the runner's window of samples: batching across
samples, docs/batched-decoding.md): their members join the same batches, each row at its own sample's positions
and teacher-forced on its own sample's reference. What fails the running item on a later sample of the window
is kept like another member's failure and raised when the item reaches that sample.

Twins (twins.py: members whose caches would be equal, given one selection by the prefill) are not decoded: each
rides with the member whose cache it equals and gets a copy of that member's outcome, or of its failure.

What happens while decoding another member belongs to that member, not to the item whose run it is:
an exception (out of memory included, after the memory is freed) is kept and raised when the member
reaches that sample, and the member's decoding runs on its own clock (--kvbench-timeout): the running
item's timer is paused, the member's time left (its limit minus its decoding done so far) applies.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from kvmethods.core.clock import now
from pytest_kvbench.cases import Case
from pytest_kvbench.engine.decode_batching import DecodeBatching
from pytest_kvbench.engine.out_of_memory import free_accelerator_memory, is_out_of_memory
from pytest_kvbench.engine.sample_outcomes import DecodedSample, SharedPrefills
from pytest_kvbench.engine.time_limit import item_time_limit
from pytest_kvbench.engine.twins import twin_outcome

# decode(member, prefilled state) -> (GenerationOutput without log-probs, kl, agreement, decode_kl)
Decode = Callable[[Case, object], tuple]


@dataclass
class SampleGroup:
    """One sample's shared prefill (kvmethods.runtime.shared_prefill.SharedPrefill) and the members it serves."""

    sample_id: str
    order: int  # the sample's place in the items' sample list (the earliest failure of an item is the one it gets)
    members: list[Case]
    shared: object
    decode: Decode  # one member alone
    context: object = None  # what BatchDecoder.decode needs of the sample (sample_prefills.SampleContext)


@dataclass
class Job:
    """One member's decoding of one sample, waiting for its batch."""

    member: Case
    state: object  # its prefilled cache (generation.PrefilledPrompt)
    own_s: float  # its own compression
    group: SampleGroup
    twins: list[Case] = field(default_factory=list)  # members whose cache equals its own (twins.py): its outcome is theirs


def _detached(error: BaseException, note: str) -> BaseException:
    """The exception without the frames (and the tensors in them) of the decoding that raised it."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current.__traceback__ is not None:
            traceback.clear_frames(current.__traceback__)
        current.__traceback__ = None
        current = current.__cause__ or current.__context__
    error.add_note(note)
    return error


@dataclass
class BatchDecoder:
    """How the runner decodes several members at once (kvmethods.runtime.batched_generation), for decode_members."""

    batching: DecodeBatching
    kind: Callable[[Case, object], str | None]  # (member, prefilled state): the batches it can join, None: alone
    decode: Callable[[list[Job]], list]  # -> per job (result, kl, agreement, decode_kl) or the exception it raised
    size: Callable[[list], int]  # members per batch for these states (batching.size with the samples' shapes)


@dataclass
class _Run:
    """What every decoding of one decode_members call shares."""

    running: Case
    own_sample: str  # the sample the running item is at: its failures there raise at once
    outcomes: SharedPrefills
    limit: item_time_limit
    time_left: Callable[[Case], float | None]
    batch: BatchDecoder | None

    def raises_now(self, job: Job) -> bool:
        return job.member.key == self.running.key and job.group.sample_id == self.own_sample

    def fail(self, job: Job, error: BaseException) -> None:
        note = f"(raised in the run of {self.running.id}, whose shared prefill of sample {job.group.sample_id} " \
               f"served this item)"
        error = _detached(error, note)
        for member in [job.member, *job.twins]:
            self.outcomes.fail(member, job.group.sample_id, error, job.group.order)

    def keep(self, job: Job, outcome: DecodedSample) -> None:
        """The member's outcome, and a copy for each of its twins."""
        self.outcomes.keep(job.member, job.group.sample_id, outcome)
        for twin in job.twins:
            self.outcomes.keep(twin, job.group.sample_id, twin_outcome(outcome, twin, job.member))


def decode_members(running: Case, groups: list[SampleGroup], outcomes: SharedPrefills, limit: item_time_limit,
                   time_left: Callable[[Case], float | None], batch: BatchDecoder | None = None) -> None:
    """Decode every member's selection of each group's shared prefill, freeing each cache once decoded, and keep
    the outcomes. `running`'s own failures on its current sample (the first group's) raise here; other members'
    and its own on later samples are kept, and other members' decoding runs on `time_left(member)` while `limit`
    (the running item's) is paused. With `batch`, the members that can batch and were measured alone once (a
    method's own decode speed: its first sample is decoded alone) decode together, the groups' members in the
    same batches, of batch.size(...) members."""
    run = _Run(running, groups[0].sample_id, outcomes, limit, time_left, batch)
    waiting: dict[str, list[Job]] = {}  # by batch kind (batched_generation.batch_kind)
    for group in groups:
        shared = group.shared
        twin_of = shared.twin_of or [None] * len(group.members)
        for index, member in enumerate(group.members):
            if twin_of[index] is not None:  # decoded with the member whose cache it equals
                continue
            state, shared.selections[index] = shared.selections[index], None
            twins = [twin for twin, original in zip(group.members, twin_of) if original == index]
            job = Job(member, state, shared.own_s[index], group, twins)
            error = shared.errors[index]
            if error is not None:
                if run.raises_now(job):
                    raise error
                run.fail(job, error)
                continue
            kind = None
            if batch is not None and not batch.batching.sequential and outcomes.measured_alone(member):
                kind = batch.kind(member, state)
            if kind is not None:
                waiting.setdefault(kind, []).append(job)
                continue
            _decode_alone(run, job)
    for together in waiting.values():
        size = batch.size([job.state for job in together])
        for start in range(0, len(together), size):
            _decode_batch(run, together[start: start + size])


def _decode_alone(run: _Run, job: Job) -> None:
    """One member decoded on its own (batch 1): the running item's failure on its sample raises, another's is kept."""
    member, sample_id = job.member, job.group.sample_id
    if run.raises_now(job):
        run.keep(job, _outcome(job, job.group.decode(member, job.state), run, 1, 1))
        return
    own = member.key == run.running.key  # a later sample of the running item: its own clock runs
    started = now()
    try:
        with contextlib.nullcontext() if own else run.limit.paused(
                run.time_left(member), f"{member.id} (sample {sample_id}, decoded in {run.running.id}'s run)"):
            decoded = job.group.decode(member, job.state)
    except Exception as exc:  # noqa: BLE001 - the member's failure, raised when it runs
        job.state = None
        run.fail(job, exc)
        if is_out_of_memory(exc):
            free_accelerator_memory()
    else:
        run.keep(job, _outcome(job, decoded, run, 1, 1))
    finally:
        if not own:
            run.outcomes.book(member, now() - started)


def _decode_batch(run: _Run, chunk: list[Job]) -> None:
    """Members decoded in one batch. Out of memory: the batch limit halves and the members are decoded again in
    smaller batches (their prefilled caches are unchanged); any other error of the batch as a whole (a time
    limit included): each member again alone, so that what fails is its own. A member's own failure in a batch
    (non-finite log-probs) is its own. The batch runs on its members' shortest clock, the running item's paused."""
    if len(chunk) == 1:
        _decode_alone(run, chunk[0])
        return
    running = run.running
    clocks = [left for left in (run.time_left(j.member) for j in chunk if j.member.key != running.key)
              if left is not None]
    samples = len({job.group.sample_id for job in chunk})
    started = now()
    try:
        with run.limit.paused(min(clocks) if clocks else None,
                              f"a decode batch of {samples} sample(s) from {chunk[0].group.sample_id} in "
                              f"{running.id}'s run"):
            results = run.batch.decode(chunk)
    except Exception as exc:  # noqa: BLE001 - decided again in smaller batches, or alone, below
        smaller = run.batch.batching.out_of_memory(len(chunk)) if is_out_of_memory(exc) else 1
        del exc
        free_accelerator_memory()
        for start in range(0, len(chunk), smaller):
            _decode_batch(run, chunk[start: start + smaller])
        return
    share = (now() - started) / len(chunk)  # the batch's time, shared equally by its members
    own_failure = None
    for job, result in zip(chunk, results):
        job.state = None  # decoded: its cache is freed now, not once every batch of the call is done
        if job.member.key != running.key:
            run.outcomes.book(job.member, share)
        if isinstance(result, BaseException):
            if run.raises_now(job):
                own_failure = result
            else:
                run.fail(job, result)
            continue
        run.keep(job, _outcome(job, result, run, len(chunk), samples))
    if own_failure is not None:
        raise own_failure


def _outcome(job: Job, decoded: tuple, run: _Run, batch_size: int, samples: int) -> DecodedSample:
    result, kl, agreement, decode_kl = decoded
    forward_s = job.group.shared.forward_s
    result.prefill_s = forward_s + job.own_s  # what this prefill costs alone: the forward + own compression
    return DecodedSample(result, kl, agreement, {"shared_prefill_ms": forward_s * 1000.0,
                                                 "compression_ms": job.own_s * 1000.0, "decode_batch": batch_size,
                                                 "decode_batch_samples": samples},
                         run.running.key, decode_kl)
