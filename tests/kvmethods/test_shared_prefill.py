"""kvmethods.runtime.shared_prefill: one forward gives every selection's cache, equal bit for bit to its own prefill,
and holds no full cache beyond the reference's."""

from __future__ import annotations

import gc

import pytest
import torch

from kvmethods import Budget, MethodError, available_methods, get_method
from kvmethods.runtime.generation import generate, prefill
from kvmethods.storage.ragged import cache_bytes
from kvmethods.runtime.shared_prefill import can_share_prefill, shared_prefill
from kvmethods.testing import live_tensor_bytes, tiny_model

TINY_HEAD = {"kivi": {"group_size": 8, "residual": 8}}  # the tiny model's head_dim is 16


def _built(name: str):
    """The method with its defaults (groups that fit the tiny model's heads), or None when an optional backend
    is missing (hf_quantized's quanto)."""
    try:
        return get_method(name, **TINY_HEAD.get(name, {}))
    except MethodError:
        return None


SHARING = [name for name in available_methods()
           if name != "full" and (method := _built(name)) is not None and can_share_prefill(method)]
BUDGETS = [Budget.parse("6"), Budget.parse("r0.5"), Budget.parse("64")]  # 64 keeps the whole prompt


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=3, qk_scale=4.0)


def prompt(n=40):
    return [int(t) for t in torch.randint(5, 200, (n,), generator=torch.Generator().manual_seed(n))]


def same_output(a, b):
    assert a.tokens == b.tokens and a.stop_token == b.stop_token
    assert a.kept_tokens_per_layer == b.kept_tokens_per_layer and a.kept_tokens_per_head == b.kept_tokens_per_head
    assert (a.kv_bytes_after, a.kv_bytes_logical) == (b.kv_bytes_after, b.kv_bytes_logical)
    assert torch.equal(a.target_logprobs, b.target_logprobs)


def test_every_builtin_prefill_time_method_shares_and_those_that_change_the_forward_do_not():
    assert {"snapkv", "h2o", "pyramidkv", "adakv", "criticalkv", "expected_attention", "kvzip", "kivi"} <= set(SHARING)
    assert can_share_prefill(get_method("adakv", base="kvzip")) and can_share_prefill(get_method("snapkv+kivi"))
    assert not {"think", "rkv", "decoding"} & set(SHARING)  # last-query storage, compression while decoding


@pytest.mark.parametrize("protocol", ["question_in_window", "query_agnostic"])
def test_shared_caches_decode_exactly_like_separate_prefills(model, protocol):
    ids, context_len = prompt(), 30
    requests = [(_built(name), budget) for name in SHARING for budget in BUDGETS]
    reference = generate(model, get_method("full"), Budget.parse("r0.0"), ids, context_len, 6, set(), protocol,
                         return_logprobs=True)
    targets = reference.tokens
    shared = shared_prefill(model, requests, ids, context_len, protocol)
    from_shared = generate(model, get_method("full"), None, ids, context_len, 6, set(), protocol,
                           return_logprobs=True, prefilled=shared.reference)
    assert from_shared.tokens == reference.tokens and torch.equal(from_shared.logprobs, reference.logprobs)
    for (method, budget), state in zip(requests, shared.selections):
        alone = generate(model, method, budget, ids, context_len, 6, set(), protocol, teacher_targets=targets)
        together = generate(model, method, budget, ids, context_len, 6, set(), protocol, teacher_targets=targets,
                            prefilled=state)
        same_output(alone, together)
    assert len(shared.own_s) == len(requests) and shared.forward_s > 0


def test_a_method_that_changes_the_forward_is_refused(model):
    with pytest.raises(MethodError, match="think changes the prefill forward"):
        shared_prefill(model, [(get_method("think"), Budget.parse("4"))], prompt(), 30, "question_in_window")


WHOLE_PROMPT_AND_QUANTIZED = [("kvzip", {}), ("kvzip", {"n_sink": 2}), ("adakv", {"base": "kvzip"}),
                              ("adakv", {"base": "kvzip", "alpha": 0, "across_layers": True}),
                              ("snapkv+kivi", TINY_HEAD["kivi"]), ("kvzip+kivi", {"bits": 4, **TINY_HEAD["kivi"]})]


@pytest.mark.parametrize("protocol", ["question_in_window", "query_agnostic"])
def test_whole_prompt_scorers_and_quantizers_decode_exactly_like_separate_prefills(model, protocol):
    """KVzip (alone, under adakv, under a quantizer) selects from the shared full cache after the forward, and
    quantizers store after it: the same kept positions, cache and answers as their own prefills."""
    ids, context_len = prompt(), 30
    requests = [(get_method(name, **params), budget) for name, params in WHOLE_PROMPT_AND_QUANTIZED for budget in BUDGETS]
    targets = generate(model, get_method("full"), Budget.parse("r0.0"), ids, context_len, 6, set(), protocol).tokens
    shared = shared_prefill(model, requests, ids, context_len, protocol)
    assert shared.errors == [None] * len(requests)
    for (method, budget), state in zip(requests, shared.selections):
        alone_state = prefill(model, method, budget, ids, context_len, protocol)
        assert len(state.kept_indices) == len(alone_state.kept_indices)
        for together_kept, alone_kept in zip(state.kept_indices, alone_state.kept_indices):
            assert (together_kept is None) == (alone_kept is None)
            assert together_kept is None or torch.equal(together_kept, alone_kept)
        alone = generate(model, method, budget, ids, context_len, 6, set(), protocol, teacher_targets=targets)
        together = generate(model, method, budget, ids, context_len, 6, set(), protocol, teacher_targets=targets,
                            prefilled=state)
        same_output(alone, together)


def test_kvzip_scores_once_for_all_budgets_of_a_sample(model, monkeypatch):
    """The reconstruction forwards do not depend on the budget: three budgets of one kvzip configuration pay
    one scoring pass, a second configuration its own; the scores each selection sees are the unshared ones."""
    from kvmethods.scorers.kvzip import KVzip

    seen = []
    unshared = KVzip.prefill_scores

    def counted(self, model, cache, input_ids):
        scores = unshared(self, model, cache, input_ids)
        seen.append((self.n_sink, [s.clone() for s in scores]))
        return scores

    ids = prompt()
    alone = {n_sink: unshared(get_method("kvzip", n_sink=n_sink), model,
                              prefill(model, get_method("full"), Budget.parse("r0.0"), ids, len(ids),
                                      "question_in_window").cache, torch.tensor([ids]))
             for n_sink in (4, 2)}
    monkeypatch.setattr(KVzip, "prefill_scores", counted)
    requests = [(get_method("kvzip", n_sink=n_sink), Budget.parse(b)) for n_sink in (4, 2) for b in ("6", "r0.5", "12")]
    shared = shared_prefill(model, requests, ids, len(ids), "question_in_window")
    assert [n_sink for n_sink, _ in seen] == [4, 2]
    for n_sink, scores in seen:
        assert all(torch.equal(a, b) for a, b in zip(scores, alone[n_sink]))
    assert all(state.scoring_s > 0 for state in shared.selections)


def test_peak_memory_is_one_full_cache_plus_the_compressed_caches(model):
    """Counted from live tensors at the end of every layer: at most the full cache (and its layer's
    transient activations, bounded by a plain prefill's peak) plus the selections' budget-sized caches
    and their kept positions. A copy of one full layer per selection would break it."""
    ids = prompt(48)
    requests = [(get_method(name), Budget.parse("4")) for name in ("snapkv", "h2o", "streamingllm", "tova")] * 4
    peaks = []

    def measure(module, args, output):
        peaks.append(live_tensor_bytes())

    def peak_of(run):
        peaks.clear()
        gc.collect()
        before = live_tensor_bytes()
        handle = model.model.layers[-1].register_forward_hook(measure)
        try:
            result = run()
        finally:
            handle.remove()
        return max(peaks) - before, result

    plain_peak, _ = peak_of(lambda: generate(model, get_method("full"), Budget.parse("r0.0"), ids, len(ids), 1,
                                             set(), "question_in_window"))
    shared_peak, shared = peak_of(lambda: shared_prefill(model, requests, ids, len(ids), "question_in_window"))
    compressed = sum(cache_bytes(state.cache)[1] for state in shared.selections)
    compressed += sum(kept.numel() * kept.element_size() for state in shared.selections for kept in state.kept_indices)
    full = cache_bytes(shared.reference.cache)[1]
    assert compressed * 4 <= full * len(requests)  # budget-sized: each far smaller than a full cache
    assert shared_peak <= plain_peak + compressed


@pytest.mark.parametrize("name, params", [("snapkv", {}), ("pyramidkv", {}), ("kvzip", {}),
                                          ("snapkv+kivi", TINY_HEAD["kivi"])])
def test_a_byte_budget_shares_at_the_methods_operating_point(model, name, params):
    ids, context_len, budget = prompt(), 30, Budget.parse("m0.25")
    method = get_method(name, **params)
    shared = shared_prefill(model, [(method, budget)], ids, context_len, "query_agnostic")
    alone = generate(model, method, budget, ids, context_len, 4, set(), "query_agnostic")
    together = generate(model, method, budget, ids, context_len, 4, set(), "query_agnostic",
                        prefilled=shared.selections[0])
    assert alone.tokens == together.tokens and alone.kept_tokens_per_layer == together.kept_tokens_per_layer
    assert alone.kept_tokens_per_layer[0] < context_len
