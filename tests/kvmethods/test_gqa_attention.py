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
