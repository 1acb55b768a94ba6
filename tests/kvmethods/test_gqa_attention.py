"""attention.gqa_attention: a masked multi-token forward attends with sdpa's own GQA instead of repeated KV heads,
with the very outputs of transformers' sdpa attention, and the model's attention implementation is restored; a
half-precision decoding step on CPU is float32 attention rounded once, and greedy decoding runs its steps so."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvmethods import FULL_CACHE, get_method
from kvmethods.adapters.transformers_compat import attention_implementation, sdpa_attention_forward
from kvmethods.attention import gqa_attention
from kvmethods.attention.gqa_attention import ATTENTION_NAME, _one_query_in_float32, masked_gqa, masked_gqa_attention
from kvmethods.runtime.generation import generate
from kvmethods.testing import tiny_model


def test_masked_multi_token_attention_equals_transformers_sdpa_bit_for_bit():
    generator = torch.Generator().manual_seed(0)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    query = torch.randn(4, 9, 5, 16, generator=generator)
    key, value = (torch.randn(4, 3, 40, 16, generator=generator) for _ in range(2))
    mask = torch.rand(4, 1, 5, 40, generator=generator) > 0.3
    mask[..., 0] = True  # every query sees something
    ours, _ = masked_gqa_attention(module, query, key, value, mask, scaling=0.25)
    theirs, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    assert ours.shape == theirs.shape == (4, 5, 9, 16)
    assert torch.equal(ours, theirs)


def test_the_model_attends_with_it_only_inside_and_its_implementation_comes_back():
    model = tiny_model("llama", seed=1)
    before = attention_implementation(model)
    assert before == "sdpa"
    with masked_gqa(model):
        assert attention_implementation(model) == ATTENTION_NAME
    assert attention_implementation(model) == before


def _float32_sdpa(module, query, key, value, mask, scaling):
    mask = mask if mask is None or mask.dtype == torch.bool else mask.float()
    out, _ = sdpa_attention_forward(module, query.float(), key.float(), value.float(), mask, scaling=scaling)
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "bool_per_head", "additive"])
def test_a_half_precision_decoding_step_is_float32_attention_rounded_once(dtype, mask_kind):
    generator = torch.Generator().manual_seed(1)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    query = torch.randn(2, 9, 1, 16, generator=generator).to(dtype)
    key, value = (torch.randn(2, 3, 300, 16, generator=generator).to(dtype) for _ in range(2))
    mask = None
    if mask_kind != "none":
        heads = 9 if mask_kind == "bool_per_head" else 1
        mask = torch.rand(2, heads, 1, 300, generator=generator) > 0.5
        mask[..., -1] = True
        if mask_kind == "additive":
            mask = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf")).to(dtype)
    ours, _ = masked_gqa_attention(module, query, key, value, mask, scaling=0.25)
    exact = _float32_sdpa(module, query, key, value, mask, 0.25)
    assert ours.dtype == dtype and ours.shape == (2, 1, 9, 16)
    # float32 inside, one rounding to the half dtype at the end: within half a unit in the last place
    assert torch.equal(ours, exact.to(dtype))  or (ours.float() - exact).abs().max() <= exact.abs().max() * 2 ** -8


def test_a_step_that_changes_attention_or_a_float32_model_goes_to_transformers_sdpa():
    generator = torch.Generator().manual_seed(2)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    query = torch.randn(1, 9, 1, 16, generator=generator)
    key, value = (torch.randn(1, 3, 50, 16, generator=generator) for _ in range(2))
    ours, _ = masked_gqa_attention(module, query, key, value, None, scaling=0.25)
    theirs, _ = sdpa_attention_forward(module, query, key, value, None, scaling=0.25)
    assert torch.equal(ours, theirs)  # float32: unchanged, bit for bit
    half = [tensor.to(torch.bfloat16) for tensor in (query, key, value)]
    capped, _ = masked_gqa_attention(module, *half, None, scaling=0.25, softcap=None)
    assert torch.equal(capped, _one_query_in_float32(*half, None, 0.25))
    sinks = torch.zeros(9)
    with_sinks = masked_gqa_attention(module, *half, None, scaling=0.25, s_aux=sinks)[0]
    assert torch.equal(with_sinks, sdpa_attention_forward(module, *half, None, scaling=0.25, s_aux=sinks)[0])


def test_greedy_decoding_of_a_bfloat16_model_runs_its_steps_through_it():
    model = tiny_model("llama", seed=1).to(torch.bfloat16)
    calls = []
    original = gqa_attention._one_query_in_float32

    def counted(*args):
        calls.append(args[0].shape)
        return original(*args)

    gqa_attention._one_query_in_float32 = counted
    try:
        result = generate(model, get_method("full"), FULL_CACHE, list(range(5, 45)), 40, 4, set(), "question_in_window")
    finally:
        gqa_attention._one_query_in_float32 = original
    assert len(result.tokens) == 4
    layers = model.config.num_hidden_layers
    assert len(calls) == 3 * layers  # every decoding step after the prefill's token, every layer
    assert all(shape[2] == 1 for shape in calls)
    assert attention_implementation(model) == "sdpa"


def test_a_float32_working_cache_goes_back_to_the_models_dtype_where_a_step_cannot_use_it():
    generator = torch.Generator().manual_seed(3)
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    query = torch.randn(1, 9, 1, 16, generator=generator).to(torch.bfloat16)
    key, value = (torch.randn(1, 3, 50, 16, generator=generator).to(torch.bfloat16) for _ in range(2))
    sinks = torch.zeros(9)
    wide = masked_gqa_attention(module, query, key.float(), value.float(), None, scaling=0.25, s_aux=sinks)[0]
    assert torch.equal(wide, sdpa_attention_forward(module, query, key, value, None, scaling=0.25, s_aux=sinks)[0])


def test_only_a_half_precision_model_on_cpu_running_sdpa_decodes_from_a_float32_working_cache():
    assert gqa_attention.decoding_cache_dtype(tiny_model("llama", seed=1)) is None  # float32 already
    assert gqa_attention.decoding_cache_dtype(tiny_model("llama", seed=1).to(torch.bfloat16)) == torch.float32
    eager = tiny_model("llama", seed=1, attn_implementation="eager").to(torch.bfloat16)
    assert gqa_attention.decoding_cache_dtype(eager) is None  # the eager attention reads the cache as it is


def test_a_bfloat16_batch_decodes_from_its_float32_working_copy_bit_for_bit(monkeypatch):
    # dense members (padded layers) and KIVI members (their working buffer mirrored): the same tokens, decoding
    # log-probs and teacher-forced log-probs as the batch holding its copy in bfloat16 (converted at every step)
    from kvmethods import Budget
    from kvmethods.runtime import batched_generation
    from kvmethods.runtime.batched_generation import BatchRequest, generate_batch
    from kvmethods.runtime.shared_prefill import shared_prefill

    model = tiny_model("llama", seed=3, qk_scale=4.0).to(torch.bfloat16)
    ids = [int(t) for t in torch.randint(5, 200, (48,), generator=torch.Generator().manual_seed(4))]
    requests = [(get_method("snapkv"), Budget.parse("12")), (get_method("streamingllm"), Budget.parse("20")),
                (get_method("kivi", group_size=8, residual=8), Budget.parse("full")),
                (get_method("snapkv+kivi", group_size=8, residual=8), Budget.parse("24"))]
    targets = generate(model, get_method("full"), FULL_CACHE, ids, 48, 12, set(), "question_in_window").tokens
    seen = []
    original = batched_generation.batched_cache

    def recorded(*args, **kwargs):
        cache = original(*args, **kwargs)
        seen.append(args[3] if len(args) > 3 else kwargs.get("dtype"))
        return cache

    monkeypatch.setattr(batched_generation, "batched_cache", recorded)
    runs = []
    for dtype in (torch.float32, None):
        monkeypatch.setattr(batched_generation, "decoding_cache_dtype", lambda model, dtype=dtype: dtype)
        states = shared_prefill(model, requests, ids, 48, "question_in_window").selections
        batches = [[BatchRequest(m, b, s) for (m, b), s in zip(requests[:2], states[:2])],  # padded layers
                   [BatchRequest(m, b, s) for (m, b), s in zip(requests[2:], states[2:])]]  # member layers
        runs.append([out for batch in batches for out in generate_batch(model, batch, len(ids), 12, set(),
                                                                          teacher_targets=targets,
                                                                          return_logprobs=True)])
    assert torch.float32 in seen and None in seen
    for wide, own in zip(*runs):
        assert wide.tokens == own.tokens and len(wide.tokens) == 12
        assert torch.equal(wide.logprobs, own.logprobs) and torch.equal(wide.target_logprobs, own.target_logprobs)
