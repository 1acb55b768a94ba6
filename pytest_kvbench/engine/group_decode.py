"""A reference group's sample, decoded member by member right after its one shared prefill.

The shared prefill of a sample makes the compressed cache of every member of the group (the items
still to run). Keeping those caches until each member's item runs would hold (members - 1) x samples
caches; instead each member's compressed generation is decoded at once (teacher-forced on the
reference and compared with it there) and only its small outcome is kept (shared_prefills.DecodedSample).
Each cache is dropped as soon as it is decoded, so a worker holds at most one sample's group of
compressed caches, and none between samples.

What happens while decoding another member belongs to that member, not to the item whose run it is:
an exception (out of memory included, after the memory is freed) is kept and raised when the member
reaches that sample, and the member's decoding runs on its own clock (--kvbench-timeout): the running
item's timer is paused, the member's time left (its limit minus its decoding done so far) applies.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

from kvmethods.runtime.clock import now
from pytest_kvbench.cases import Case
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


def decode_members(running: Case, members: list[Case], shared, sample_id: str, decode: Decode,
                   outcomes: SharedPrefills, limit: item_time_limit,
                   time_left: Callable[[Case], float | None]) -> None:
    """Decode every member's selection of `shared` (kvmethods.runtime.shared_prefill.SharedPrefill), freeing each cache
    once decoded, and keep the outcomes. `running`'s own failures raise here; other members' are kept, and
    their decoding runs on `time_left(member)` while `limit` (the running item's) is paused."""
    for index, member in enumerate(members):
        state, shared.selections[index] = shared.selections[index], None
        own_s, error = shared.own_s[index], shared.errors[index]
        if member.key == running.key:
            if error is not None:
                raise error
            outcomes.keep(member, sample_id, _outcome(decode(member, state), shared.forward_s, own_s, running))
            continue
        note = f"(raised in the run of {running.id}, whose shared prefill of sample {sample_id} served this item)"
        if error is not None:
            outcomes.fail(member, sample_id, _detached(error, note))
            continue
        started = now()
        try:
            with limit.paused(time_left(member), f"{member.id} (sample {sample_id}, decoded in {running.id}'s run)"):
                decoded = decode(member, state)
        except Exception as exc:  # noqa: BLE001 - the member's failure, raised when it runs
            state = None
            outcomes.fail(member, sample_id, _detached(exc, note))
            if is_out_of_memory(exc):
                free_accelerator_memory()
        else:
            outcomes.keep(member, sample_id, _outcome(decoded, shared.forward_s, own_s, running))
        finally:
            outcomes.book(member, now() - started)


def _outcome(decoded: tuple, forward_s: float, own_s: float, running: Case) -> DecodedSample:
    result, kl, agreement, decode_kl = decoded
    result.prefill_s = forward_s + own_s  # what this prefill costs alone: the forward + own compression
    return DecodedSample(result, kl, agreement, {"shared_prefill_ms": forward_s * 1000.0,
                                                 "compression_ms": own_s * 1000.0}, running.key, decode_kl)
