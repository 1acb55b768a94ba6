"""One sample decoded: the full-cache reference, and a compressed member teacher-forced on it and compared with it.

Functions of their arguments only (no worker state), so the runner (a sample decoded alone) and its group prefiller
(a sample's members decoded from one shared prefill, sample_prefills.py) call the same ones."""

from __future__ import annotations

from kvmethods import FULL_CACHE, get_method
from kvmethods.runtime.generation import generate
from pytest_kvbench.cases import Case
from pytest_kvbench.engine.fidelity import Reference, fidelity_of, reference_of
from pytest_kvbench.engine.models import LoadedModel


def reference_key(case: Case, sample) -> tuple:
    """The key of a sample's full-cache reference in the worker's ReferenceCache: every method and budget of the
    case's group (and protocol) shares it."""
    return (case.model, case.task, case.seed, case.context_length, sample.id, case.protocol)


def decode_reference(case: Case, task, sample, prompt, loaded: LoadedModel, shared=None) -> Reference:
    """The reference's generation; from the full cache of `shared` (a SharedPrefill), which it empties."""
    prefilled = None
    if shared is not None:  # the full cache is freed with this decoding, before any compressed one
        prefilled, shared.reference = shared.reference, None
    result = generate(loaded.model, get_method(FULL_CACHE.spec), FULL_CACHE, prompt.input_ids,
                      prompt.context_len, task.max_new_tokens, loaded.eos_token_ids, case.protocol,
                      return_logprobs=True, prefilled=prefilled)
    if shared is not None:
        result.prefill_s = shared.forward_s
    return reference_of(result, f"full-cache reference of {case.task} sample {sample.id}")


def decode_compressed(case: Case, method, budget, task, sample, prompt, loaded: LoadedModel, reference: Reference,
                      prefilled=None) -> tuple:
    """(generation, kl, agreement, decode_kl) of the sample under the case's method: teacher-forced on the
    reference's output and its own decode compared with the reference at once (fidelity.py), so no
    vocabulary-sized log-probs outlive this call."""
    result = generate(loaded.model, method, budget, prompt.input_ids, prompt.context_len, task.max_new_tokens,
                      loaded.eos_token_ids, case.protocol, teacher_targets=reference.target_ids,
                      prefilled=prefilled, return_logprobs=True)
    return (result, *fidelity_of(result, reference, f"{case.id} sample {sample.id}"))
