"""A reference group's sample, decoded member by member right after its one shared prefill.

The shared prefill of a sample makes the compressed cache of every member of the group (the items
still to run). Keeping those caches until each member's item runs would hold (members - 1) x samples
caches; instead each member's compressed generation is decoded at once (teacher-forced on the
reference and compared with it there) and only its small outcome is kept (shared_prefills.DecodedSample).
Each cache is dropped as soon as it is decoded, so a worker holds at most one sample's group of
compressed caches, and none between samples.

Members whose method and cache can batch (kvmethods.runtime.batched_generation.can_decode_in_batch) decode
together, one forward per step for the batch (`--kvbench-decode-batch`, engine/decode_batching.py), once each
was decoded alone on its first sample: that sample measures the method's own decode speed (a batch's time is
shared equally among its members, which blurs it), the record's `decode_tokens_per_s_alone`. Each sample row
says how many members its decoding shared a batch with (`decode_batch`, 1: alone).

What happens while decoding another member belongs to that member, not to the item whose run it is:
an exception (out of memory included, after the memory is freed) is kept and raised when the member
reaches that sample, and the member's decoding runs on its own clock (--kvbench-timeout): the running
item's timer is paused, the member's time left (its limit minus its decoding done so far) applies.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from dataclasses import dataclass

from kvmethods.runtime.clock import now
from pytest_kvbench.cases import Case
from pytest_kvbench.engine.decode_batching import DecodeBatching
from pytest_kvbench.engine.out_of_memory import free_accelerator_memory, is_out_of_memory
from pytest_kvbench.engine.shared_prefills import DecodedSample, SharedPrefills
from pytest_kvbench.engine.time_limit import item_time_limit

# decode(member, prefilled state) -> (GenerationOutput without log-probs, kl, agreement, decode_kl)
Decode = Callable[[Case, object], tuple]


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
    decode: Callable[[list[Case], list], list]  # -> per member (result, kl, agreement) or the exception it raised
    size: Callable[[list], int]  # members per batch for these states (batching.size with the sample's shapes)


def decode_members(running: Case, members: list[Case], shared, sample_id: str, decode: Decode,
                   outcomes: SharedPrefills, limit: item_time_limit,
                   time_left: Callable[[Case], float | None], batch: BatchDecoder | None = None) -> None:
    """Decode every member's selection of `shared` (kvmethods.runtime.shared_prefill.SharedPrefill), freeing each cache
    once decoded, and keep the outcomes. `running`'s own failures raise here; other members' are kept, and
    their decoding runs on `time_left(member)` while `limit` (the running item's) is paused. With `batch`, the
    members that can batch and were measured alone once (a method's own decode speed: its first sample is
    decoded alone) decode together, in batches of batch.size(...) members."""
    waiting: dict[str, list[tuple[Case, object, float]]] = {}  # by batch kind (batched_generation.batch_kind)
    for index, member in enumerate(members):
        state, shared.selections[index] = shared.selections[index], None
        own_s, error = shared.own_s[index], shared.errors[index]
        if error is not None:
            if member.key == running.key:
                raise error
            outcomes.fail(member, sample_id, _detached(error, _note(running, sample_id)))
            continue
        kind = None
        if batch is not None and not batch.batching.sequential and outcomes.measured_alone(member):
            kind = batch.kind(member, state)
        if kind is not None:
            waiting.setdefault(kind, []).append((member, state, own_s))
            continue
        _decode_alone(running, member, state, own_s, shared.forward_s, sample_id, decode, outcomes, limit, time_left)
    for together in waiting.values():
        size = batch.size([state for _, state, _ in together])
        for start in range(0, len(together), size):
            _decode_batch(running, together[start: start + size], shared.forward_s, sample_id, decode, outcomes,
                          limit, time_left, batch)


def _note(running: Case, sample_id: str) -> str:
    return f"(raised in the run of {running.id}, whose shared prefill of sample {sample_id} served this item)"


def _decode_alone(running: Case, member: Case, state, own_s: float, forward_s: float, sample_id: str, decode: Decode,
                  outcomes: SharedPrefills, limit: item_time_limit, time_left: Callable[[Case], float | None]) -> None:
    """One member decoded on its own (batch 1): the running item's failure raises, another's is kept."""
    if member.key == running.key:
        outcomes.keep(member, sample_id, _outcome(decode(member, state), forward_s, own_s, running, 1))
        return
    started = now()
    try:
        with limit.paused(time_left(member), f"{member.id} (sample {sample_id}, decoded in {running.id}'s run)"):
            decoded = decode(member, state)
    except Exception as exc:  # noqa: BLE001 - the member's failure, raised when it runs
        state = None
        outcomes.fail(member, sample_id, _detached(exc, _note(running, sample_id)))
        if is_out_of_memory(exc):
            free_accelerator_memory()
    else:
        outcomes.keep(member, sample_id, _outcome(decoded, forward_s, own_s, running, 1))
    finally:
        outcomes.book(member, now() - started)


def _decode_batch(running: Case, chunk: list[tuple[Case, object, float]], forward_s: float, sample_id: str,
                  decode: Decode, outcomes: SharedPrefills, limit: item_time_limit,
                  time_left: Callable[[Case], float | None], batch: BatchDecoder) -> None:
    """Members decoded in one batch. Out of memory: the batch limit halves and the members are decoded again in
    smaller batches (their prefilled caches are unchanged); any other error of the batch as a whole (a time
    limit included): each member again alone, so that what fails is its own. A member's own failure in a batch
    (non-finite log-probs) is its own. The batch runs on its members' shortest clock, the running item's paused."""
    if len(chunk) == 1:
        member, state, own_s = chunk[0]
        _decode_alone(running, member, state, own_s, forward_s, sample_id, decode, outcomes, limit, time_left)
        return
    members = [member for member, _, _ in chunk]
    clocks = [left for left in (time_left(m) for m in members if m.key != running.key) if left is not None]
    started = now()
    try:
        with limit.paused(min(clocks) if clocks else None, f"a decode batch of sample {sample_id} in {running.id}'s run"):
            results = batch.decode(members, [state for _, state, _ in chunk])
    except Exception as exc:  # noqa: BLE001 - decided again in smaller batches, or alone, below
        smaller = batch.batching.out_of_memory(len(chunk)) if is_out_of_memory(exc) else 1
        del exc
        free_accelerator_memory()
        for start in range(0, len(chunk), smaller):
            _decode_batch(running, chunk[start: start + smaller], forward_s, sample_id, decode, outcomes, limit,
                          time_left, batch)
        return
    share = (now() - started) / len(chunk)  # the batch's time, shared equally by its members
    own_failure = None
    for (member, _, own_s), result in zip(chunk, results):
        if member.key != running.key:
            outcomes.book(member, share)
        if isinstance(result, BaseException):
            if member.key == running.key:
                own_failure = result
            else:
                outcomes.fail(member, sample_id, _detached(result, _note(running, sample_id)))
            continue
        outcomes.keep(member, sample_id, _outcome(result, forward_s, own_s, running, len(chunk)))
    if own_failure is not None:
        raise own_failure


def _outcome(decoded: tuple, forward_s: float, own_s: float, running: Case, batch_size: int) -> DecodedSample:
    result, kl, agreement, decode_kl = decoded
    result.prefill_s = forward_s + own_s  # what this prefill costs alone: the forward + own compression
    return DecodedSample(result, kl, agreement, {"shared_prefill_ms": forward_s * 1000.0,
                                                 "compression_ms": own_s * 1000.0, "decode_batch": batch_size},
                         running.key, decode_kl)
