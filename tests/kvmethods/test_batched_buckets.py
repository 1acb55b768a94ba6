"""A padded batch attends in groups of rows (storage/batched.BatchedLayer.buckets, attention/gqa_attention.py):
the rows are ordered longest cache first, kept tokens right-aligned, and each group of rows attends over its own
slice of the keys, not over the whole batch's padding. The cut points are the fewest attended slots; the groups
give the attention of the whole padded batch (tokens equal, log-probs within float rounding), in request order."""

from __future__ import annotations

import itertools

import pytest
import torch

from kvmethods import Budget, get_method
from kvmethods.attention import gqa_attention
from kvmethods.runtime.batched_generation import BatchRequest, generate_batch
from kvmethods.runtime.generation import generate
from kvmethods.runtime.shared_prefill import shared_prefill
from kvmethods.storage.batched import BatchedLayer, buckets_of
from kvmethods.testing import tiny_model


def attended(lengths, runs):
    return sum(max(lengths[first:end]) * (end - first) for first, end in runs)


@pytest.mark.parametrize("lengths", [[9, 9, 3, 3, 3, 1], [5, 1, 5, 1, 5], [7], [4, 4, 4, 4], [12, 2, 11, 8, 3, 3, 9, 1]])
@pytest.mark.parametrize("most", [1, 2, 3, 4])
def test_the_cut_points_are_the_fewest_attended_slots(lengths, most):
    runs = buckets_of(lengths, most)
    assert runs[0][0] == 0 and runs[-1][1] == len(lengths) and len(runs) <= most
    assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(runs, runs[1:]))
    best = min(attended(lengths, list(zip((0,) + cuts, cuts + (len(lengths),))))
               for k in range(min(most, len(lengths)))
               for cuts in itertools.combinations(range(1, len(lengths)), k))
    assert attended(lengths, runs) == best


def test_a_batch_attending_in_groups_equals_the_whole_padded_batch_and_alone(monkeypatch):
    model = tiny_model("llama", seed=3, qk_scale=4.0)
    ids = [int(t) for t in torch.randint(5, 200, (48,), generator=torch.Generator().manual_seed(48))]
    # request order shortest first: generate_batch reorders its rows and must give the outputs back in this order
    methods = [(get_method("snapkv"), Budget.parse("4")), (get_method("streamingllm"), Budget.parse("8")),
               (get_method("adakv", window=4), Budget.parse("12")), (get_method("pyramidkv"), Budget.parse("16")),
               (get_method("snapkv"), Budget.parse("r0.5")), (get_method("tova"), Budget.parse("40"))]
    eos, new = {0}, 6
    shared = shared_prefill(model, methods, ids, 48, "question_in_window")
    grouped = []
    original = gqa_attention._buckets

    def spy(*args):
        buckets = original(*args)
        grouped.append(buckets is not None)
        return buckets

    monkeypatch.setattr(gqa_attention, "_buckets", spy)
    requests = [BatchRequest(m, b, s) for (m, b), s in zip(methods, shared.selections)]
    reference = generate(model, get_method("full"), None, ids, 48, new, eos, "question_in_window", prefilled=shared.reference)
    targets = reference.tokens + ([reference.stop_token] if reference.stop_token is not None else [])
    in_groups = generate_batch(model, requests, len(ids), new, eos, teacher_targets=targets, return_logprobs=True)
    assert any(grouped), "no layer attended in groups"
    monkeypatch.setattr(BatchedLayer, "MOST_BUCKETS", 1)  # the whole padded batch at once
    grouped.clear()
    whole = generate_batch(model, requests, len(ids), new, eos, teacher_targets=targets, return_logprobs=True)
    assert not any(grouped)
    for (method, budget), a, b, state in zip(methods, in_groups, whole, shared.selections):
        alone = generate(model, method, budget, ids, 48, new, eos, "question_in_window", return_logprobs=True,
                         teacher_targets=targets)
        assert a.tokens == b.tokens == alone.tokens, f"{method.name}@{budget.spec}"
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=0)
        torch.testing.assert_close(a.target_logprobs, b.target_logprobs, atol=1e-5, rtol=0)
        torch.testing.assert_close(a.logprobs, alone.logprobs, atol=1e-3, rtol=0)
