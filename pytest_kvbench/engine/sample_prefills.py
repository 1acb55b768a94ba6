"""The runner's shared prefills: one forward per sample for a reference group, and the window of samples whose
members decode in the same batches.

Split from runner.py (Runner inherits it), which reads a sample's outcomes; this part makes them. For the sample
an item needs, one shared prefill (kvmethods.runtime.shared_prefill) gives the reference's full cache, decoded at
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

from typing import NamedTuple

from kvmethods.runtime.batched_generation import BatchRequest, batch_kind, generate_batch
from kvmethods.runtime.shared_prefill import shared_prefill
from pytest_kvbench.cases import Case
from pytest_kvbench.engine.group_decode import BatchDecoder, Job, SampleGroup, decode_members
from pytest_kvbench.engine.models import LoadedModel
from pytest_kvbench.engine.out_of_memory import free_accelerator_memory, is_out_of_memory
from pytest_kvbench.engine.time_limit import ItemTimeout, item_time_limit
from pytest_kvbench.engine.fidelity import fidelity_of


class SampleContext(NamedTuple):
    """What a sample's members need to decode and be scored (SampleGroup.context)."""

    task: object
    sample: object
    prompt: object
    loaded: LoadedModel
    reference: object  # the reference's generation: its target_ids teacher-force the members


class GroupPrefill:
    """Runner's shared-prefill methods (needs the runner's shared, batching, references, prompt, _load_samples,
    _reference_key, _decode_reference, _compressed, _method, _shares and _time_left)."""

    def _share_prefill(self, case: Case, members: list[Case], task, sample, prompt, loaded: LoadedModel,
                       limit: item_time_limit) -> None:
        """One prefill of the sample (and of the window's next samples) for the reference (if not made yet) and
        every member (sharing items of the group still to run), each member's cache decoded and only its outcome
        kept."""
        groups = [self._sample_group(case, members, task, sample, prompt, loaded, self._order(case, task, sample,
                                                                                               loaded))]
        groups += self._window(case, groups[0], task, loaded)
        batch = BatchDecoder(self.batching, lambda member, state: batch_kind(self._method(member), state),
                             self._compressed_batch, lambda states: self._batch_size(states, task, groups))
        decode_members(case, groups, self.shared, limit, self._time_left, batch)

    def _order(self, case: Case, task, sample, loaded: LoadedModel) -> int:
        """The sample's place in the item's list (past its end where it is not in it: no window follows)."""
        samples = self._load_samples(case, task, loaded)
        return next((i for i, s in enumerate(samples) if s.id == sample.id), len(samples))

    def _batch_size(self, states: list, task, groups: list[SampleGroup]) -> int:
        """Members per batch (DecodeBatching.size): each decoding step's log-probs (decode_kl) beside the
        teacher-forced ones over the groups' longest reference output (at most max_new_tokens + its eos)."""
        targets = max(len(group.context.reference.target_ids) for group in groups)
        return self.batching.size(states, task.max_new_tokens, targets, int(states[0].next_logits.shape[-1]))

    def _sample_group(self, case: Case, members: list[Case], task, sample, prompt, loaded: LoadedModel,
                      order: int) -> SampleGroup:
        """The sample's shared prefill, its reference decoded (its full cache freed) unless made already."""
        shared = self._prefill_for(members, task, prompt, loaded, case.protocol)
        reference = self.references.get(self._reference_key(case, sample),
                                        lambda: self._decode_reference(case, task, sample, prompt, loaded, shared))
        shared.reference = None  # a reference made earlier: this full cache is not needed

        def decode(member: Case, state):
            return self._compressed(member, self._method(member), member.budget, task, sample, prompt, loaded,
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
            kind = None if state is None else batch_kind(self._method(member), state)
            if kind is not None:
                kinds.setdefault(kind, []).append(state)
        if not kinds:
            return []
        together = min(self.batching.samples_together(self._batch_size(states, task, [first]), len(states))
                       for states in kinds.values())
        samples = self._load_samples(case, task, loaded)
        groups: list[SampleGroup] = []
        held = len(first.members)
        for order in range(first.order + 1, min(first.order + together, len(samples))):
            sample = samples[order]
            members = [c for c in self.shared.members(case, sample.id) if self._shares(c)]
            if not members or len(members) > len(first.members) or self._reference_key(case, sample) in self.references:
                break
            try:
                groups.append(self._sample_group(case, members, task, sample, self.prompt(case, task, sample, loaded),
                                                 loaded, order))
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

    def _prefill_for(self, members: list[Case], task, prompt, loaded: LoadedModel, protocol: str):
        return shared_prefill(loaded.model, [(self._method(c), c.budget) for c in members], prompt.input_ids,
                              prompt.context_len, protocol, len(prompt.input_ids) + task.max_new_tokens)

    def _compressed_batch(self, jobs: list[Job]) -> list:
        """_compressed for several members, of one sample or several, at once (one batched decoding): per job
        (generation, kl, agreement, decode_kl), or what failed that member alone (non-finite log-probs)."""
        task, loaded = jobs[0].group.context.task, jobs[0].group.context.loaded
        requests = []
        for job in jobs:
            sample_context = job.group.context
            requests.append(BatchRequest(self._method(job.member), job.member.budget, job.state,
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
