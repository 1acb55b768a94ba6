"""attention.gqa_attention: a masked multi-token forward attends with sdpa's own GQA instead of repeated KV heads,
with the very outputs of transformers' sdpa attention, and the model's attention implementation is restored."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from kvmethods.adapters.transformers_compat import attention_implementation, sdpa_attention_forward
from kvmethods.attention.gqa_attention import ATTENTION_NAME, masked_gqa, masked_gqa_attention
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
