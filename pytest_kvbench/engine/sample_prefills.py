"""The runner's shared prefills: one forward per sample for a reference group, and the window of samples whose
members decode in the same batches.

The runner holds a GroupPrefiller (composition, not inheritance) and asks it for a sample's full-cache reference.
Its interface: built from what it reads and fills (the worker's SharedPrefills: the plan and the members' outcomes;
its DecodeBatching; its ReferenceCache; its SampleInputs), `reference(case, task, sample, prompt, loaded, limit,
time_left)` returns the sample's reference and leaves every sharing member's outcome in SharedPrefills, which the
items then take. It needs nothing else of the runner: the running item's time limit and a member's time left come
with the call.

For the sample an item needs, one shared prefill (kvmethods.runtime.shared_prefill) gives the reference's full cache, decoded at
once (the members are teacher-forced on its output), and every member's compressed cache. Batching across
samples (`--kvbench-decode-batch` above 1, once every member's first sample was decoded alone): the next samples
of the item's list are prefilled too, as many whole groups as one batch holds
(`DecodeBatching.samples_together`, per batch kind), each sample's reference decoded right after its prefill (so at
most one full cache is held), and the members of all of them decode together (group_decode.py), each row at its own
sample's positions and teacher-forced on its own sample's reference. The compressed caches of a kind held while
the window fills are bounded by that kind's batch limit, in members. A prefill of a later sample that fails (out
of memory included: the limit halves) ends the window there; that sample is prefilled again when the item
reaches it, where what it raises belongs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from kvmethods.runtime.batched_generation import BatchRequest, batch_kind, generate_batch
from kvmethods.runtime.shared_prefill import shared_prefill
from pytest_kvbench.cases import Case
from pytest_kvbench.engine.case_methods import method_of, takes_shared_prefill
from pytest_kvbench.engine.decode_batching import DecodeBatching
from pytest_kvbench.engine.fidelity import Reference, ReferenceCache, fidelity_of
from pytest_kvbench.engine.group_decode import BatchDecoder, Job, SampleGroup, decode_members
from pytest_kvbench.engine.models import LoadedModel
from pytest_kvbench.engine.out_of_memory import free_accelerator_memory, is_out_of_memory
from pytest_kvbench.engine.sample_decoding import decode_compressed, decode_reference, reference_key
from pytest_kvbench.engine.sample_inputs import SampleInputs
from pytest_kvbench.engine.sample_outcomes import SharedPrefills
from pytest_kvbench.engine.time_limit import ItemTimeout, item_time_limit
from pytest_kvbench.engine.twins import find_twins, spread_to_twins


class SampleContext(NamedTuple):
    """What a sample's members need to decode and be scored (SampleGroup.context)."""

    task: object
    sample: object
    prompt: object
    loaded: LoadedModel
    reference: object  # the reference's generation: its target_ids teacher-force the members


class GroupPrefiller:
    """A worker's shared prefills of reference groups (one per runner)."""

    def __init__(self, shared: SharedPrefills, batching: DecodeBatching, references: ReferenceCache,
                 inputs: SampleInputs) -> None:
        self.shared = shared  # the plan (members of a group) and the members' outcomes it fills
        self.batching = batching  # members per batch, samples per window; halved on out of memory
        self.references = references  # the full-cache references it fills (sample_decoding.reference_key)
        self.inputs = inputs  # the cases' samples and prompts

    def reference(self, case: Case, task, sample, prompt, loaded: LoadedModel, limit: item_time_limit,
                  time_left: Callable[[Case], float | None]) -> Reference | None:
        """The sample's full-cache reference. The first item of the group to need the sample (or a sharing item
        finding no outcome of its own) runs the group's shared prefill and decoding for it: every sharing member's
        outcome is left in `shared` for its item; `limit` is the running item's, `time_left(member)` another
        member's."""
        members = [c for c in self.shared.members(case, sample.id) if takes_shared_prefill(c)]
        if reference_key(case, sample) not in self.references or (members and members[0] == case):
            self._share_prefill(case, members, task, sample, prompt, loaded, limit, time_left)
        return self.references.get(reference_key(case, sample), lambda: None)

    def _share_prefill(self, case: Case, members: list[Case], task, sample, prompt, loaded: LoadedModel,
                       limit: item_time_limit, time_left: Callable[[Case], float | None]) -> None:
        """One prefill of the sample (and of the window's next samples) for the reference (if not made yet) and
        every member (sharing items of the group still to run), each member's cache decoded and only its outcome
        kept."""
        groups = [self._sample_group(case, members, task, sample, prompt, loaded, self._order(case, task, sample,
                                                                                               loaded))]
        groups += self._window(case, groups[0], task, loaded)
        batch = BatchDecoder(self.batching, lambda member, state: batch_kind(method_of(member), state),
                             self.compressed_batch, lambda states: self._batch_size(states, task, groups))
        decode_members(case, groups, self.shared, limit, time_left, batch)

    def _order(self, case: Case, task, sample, loaded: LoadedModel) -> int:
        """The sample's place in the item's list (past its end where it is not in it: no window follows)."""
        samples = self.inputs.samples(case, task, loaded)
        return next((i for i, s in enumerate(samples) if s.id == sample.id), len(samples))

    def _batch_size(self, states: list, task, groups: list[SampleGroup]) -> int:
        """Members per batch (DecodeBatching.size): each decoding step's log-probs (decode_kl) beside the
        teacher-forced ones over the groups' longest reference output (at most max_new_tokens + its eos)."""
        targets = max(len(group.context.reference.target_ids) for group in groups)
        return self.batching.size(states, task.max_new_tokens, targets, int(states[0].next_logits.shape[-1]))

    def _sample_group(self, case: Case, members: list[Case], task, sample, prompt, loaded: LoadedModel,
                      order: int) -> SampleGroup:
        """The sample's shared prefill, its reference decoded (its full cache freed) unless made already."""
        shared = self.prefill(members, task, prompt, loaded, case.protocol)
        reference = self.references.get(reference_key(case, sample),
                                        lambda: decode_reference(case, task, sample, prompt, loaded, shared))
        shared.reference = None  # a reference made earlier: this full cache is not needed

        def decode(member: Case, state):
            return self.compressed(member, method_of(member), member.budget, task, sample, prompt, loaded,
                                   reference, state)

        return SampleGroup(sample.id, order, members, shared, decode,
                           SampleContext(task, sample, prompt, loaded, reference))

    def _window(self, case: Case, first: SampleGroup, task, loaded: LoadedModel) -> list[SampleGroup]:
        """The groups of the samples after `first` that decode in the same batches (batching across samples):
        as many samples as every batch kind's limit holds whole (its members of a sample x samples <= its batch
        size), once every member of the first was measured alone, while the next sample still needs its shared
        prefill (no reference yet, members waiting)."""
        if self.batching.sequential or not all(self.shared.measured_alone(m) for m in first.members):
            return []
        kinds: dict[str, list] = {}  # the first sample's batchable states by batch kind
        for member, state in zip(first.members, first.shared.selections):
            kind = None if state is None else batch_kind(method_of(member), state)
            if kind is not None:
                kinds.setdefault(kind, []).append(state)
        if not kinds:
            return []
        together = min(self.batching.samples_together(self._batch_size(states, task, [first]), len(states))
                       for states in kinds.values())
        samples = self.inputs.samples(case, task, loaded)
        groups: list[SampleGroup] = []
        held = len(first.members)
        for order in range(first.order + 1, min(first.order + together, len(samples))):
            sample = samples[order]
            members = [c for c in self.shared.members(case, sample.id) if takes_shared_prefill(c)]
            if not members or len(members) > len(first.members) or reference_key(case, sample) in self.references:
                break
            try:
                prompt = self.inputs.prompt(case, task, sample, loaded)
                groups.append(self._sample_group(case, members, task, sample, prompt, loaded, order))
            except ItemTimeout:
                raise
            except Exception as exc:  # noqa: BLE001 - raised again when the item reaches the sample
                if is_out_of_memory(exc):
                    self.batching.out_of_memory(held + len(members))
                del exc
                free_accelerator_memory()
                break
            held += len(members)
        return groups

    def prefill(self, members: list[Case], task, prompt, loaded: LoadedModel, protocol: str):
        """The sample's shared prefill (kvmethods.runtime.shared_prefill): the full cache and every member's. Twins
        (twins.py: members whose caches would be equal) get one selection, their first's: a twin's state is None
        and the prefill's `twin_of` names the member it rides with."""
        requests = [(method_of(c), c.budget) for c in members]
        twin_of = find_twins(loaded.model, requests, prompt, protocol)
        own = [index for index, twin in enumerate(twin_of) if twin is None]
        shared = shared_prefill(loaded.model, [requests[i] for i in own], prompt.input_ids, prompt.context_len,
                                protocol, len(prompt.input_ids) + task.max_new_tokens)
        return spread_to_twins(shared, own, twin_of)

    def compressed(self, case: Case, method, budget, task, sample, prompt, loaded: LoadedModel, reference,
                   prefilled=None) -> tuple:
        """One member's decoding of its prefilled cache (sample_decoding.decode_compressed)."""
        return decode_compressed(case, method, budget, task, sample, prompt, loaded, reference, prefilled)

    def compressed_batch(self, jobs: list[Job]) -> list:
        """`compressed` for several members, of one sample or several, at once (one batched decoding): per job
        (generation, kl, agreement, decode_kl), or what failed that member alone (non-finite log-probs)."""
        task, loaded = jobs[0].group.context.task, jobs[0].group.context.loaded
        requests = []
        for job in jobs:
            sample_context = job.group.context
            requests.append(BatchRequest(method_of(job.member), job.member.budget, job.state,
                                         len(sample_context.prompt.input_ids), sample_context.reference.target_ids))
        results = generate_batch(loaded.model, requests, None, task.max_new_tokens, loaded.eos_token_ids,
                                 return_logprobs=True)
        made: list = []
        for job, result in zip(jobs, results):
            sample, reference = job.group.context.sample, job.group.context.reference
            try:
                made.append((result, *fidelity_of(result, reference, f"{job.member.id} sample {sample.id}")))
            except Exception as exc:  # noqa: BLE001 - that member's failure, the others' results stand
                made.append(exc)
        return made
