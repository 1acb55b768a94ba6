"""Sliding layers attend over their band of keys in a multi-token forward (attention/banded_attention.py): the same
outputs as sdpa over the whole mask, keys outside the band never read, global layers untouched, and the queries a
capture keeps are the whole layer's."""

from __future__ import annotations

import contextlib

import pytest
import torch

from kvmethods.adapters.transformers_compat import (DynamicCache, attention_implementation, cache_argument,
                                                    sdpa_attention_forward)
from kvmethods.attention.banded_attention import (ATTENTION_NAME, banded_attention, banded_sdpa_attention,
                                                  query_bands)
from kvmethods.attention.query_capture import capturing_queries
from kvmethods.testing import WINDOW, family_model, tiny_model

TOKENS = 5 * WINDOW + 3  # several chunks, the last one short


@pytest.fixture(scope="module")
def gemma3():
    # global first, then sliding, then global: a global layer whose inputs no banded layer has touched
    return family_model("gemma3_text", num_hidden_layers=3, qk_scale=4.0,
                        layer_types=["full_attention", "sliding_attention", "full_attention"])


def _forward(model, ids, mask=None, banded=False, cache=None):
    cache = DynamicCache() if cache is None else cache
    with torch.no_grad(), (banded_attention(model) if banded else contextlib.nullcontext()):
        return model(input_ids=ids, attention_mask=mask, use_cache=True, **cache_argument(model, cache))


def test_the_bands_are_each_chunks_own_keys_and_the_window_before_them():
    positions = torch.arange(40)
    mask = (positions[None, :] <= positions[:, None]) & (positions[:, None] - positions[None, :] < 8)
    assert query_bands(mask[None, None], 8) == [(0, 8, 0, 8), (8, 16, 1, 16), (16, 24, 9, 24), (24, 32, 17, 32),
                                                 (32, 40, 25, 40)]


def test_a_forward_gives_sdpas_logits_and_cache_and_the_implementation_comes_back(gemma3):
    ids = torch.randint(3, 128, (1, TOKENS), generator=torch.Generator().manual_seed(1))
    plain, banded = _forward(gemma3, ids), _forward(gemma3, ids, banded=True)
    torch.testing.assert_close(banded.logits, plain.logits, atol=2e-5, rtol=1e-5)
    for mine, theirs in zip(banded.past_key_values.layers, plain.past_key_values.layers):
        torch.testing.assert_close(mine.keys, theirs.keys, atol=2e-5, rtol=1e-5)
    assert attention_implementation(gemma3) == "sdpa"


def test_a_left_padded_batch_gives_sdpas_logits(gemma3):
    ids = torch.randint(3, 128, (2, TOKENS), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, :WINDOW + 5] = 0  # the second row is shorter: its padding straddles the first chunks
    plain, banded = _forward(gemma3, ids, mask), _forward(gemma3, ids, mask, banded=True)
    torch.testing.assert_close(banded.logits[:, WINDOW + 5:], plain.logits[:, WINDOW + 5:], atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(banded.logits[0], plain.logits[0], atol=2e-5, rtol=1e-5)


def test_a_forward_after_cached_tokens_reads_no_key_its_window_hides(gemma3):
    ids = torch.randint(3, 128, (1, 5 * WINDOW), generator=torch.Generator().manual_seed(5))
    for banded in (False, True):
        cache = DynamicCache()
        _forward(gemma3, ids[:, :2 * WINDOW], cache=cache)
        cache.layers[1].values[:, :, :WINDOW] = float("nan")  # before every window of the next forward's queries
        logits = _forward(gemma3, ids[:, 2 * WINDOW:], banded=banded, cache=cache).logits
        assert logits.isnan().all() != banded  # sdpa over the whole mask multiplies NaN by a weight of 0


def _layer_call(model, layer_idx, n=TOKENS, seed=3):
    """A sliding mask of the model's window and random queries/keys/values of one layer's shapes."""
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    query = torch.randn(1, config.num_attention_heads, n, config.head_dim, generator=generator)
    key, value = (torch.randn(1, config.num_key_value_heads, n, config.head_dim, generator=generator)
                  for _ in range(2))
    positions = torch.arange(n)
    mask = (positions[None, :] <= positions[:, None]) & (positions[:, None] - positions[None, :] < WINDOW)
    return model.model.layers[layer_idx].self_attn, query, key, value, mask[None, None]


def test_keys_outside_a_chunks_band_are_never_read(gemma3):
    module, query, key, value, mask = _layer_call(gemma3, 1)
    value[:, :, :WINDOW] = float("nan")  # seen by the first chunk only (queries 0 .. WINDOW - 1)
    with banded_attention(gemma3):
        out, _ = banded_sdpa_attention(module, query, key, value, mask, scaling=module.scaling)
    whole, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=module.scaling)
    assert whole[:, 2 * WINDOW:].isnan().all()  # sdpa over the whole mask multiplies NaN by a weight of 0
    assert not out[:, 2 * WINDOW:].isnan().any() and out[:, :WINDOW].isnan().all()


def test_global_layers_and_single_queries_are_sdpa_bit_for_bit(gemma3):
    module, query, key, value, mask = _layer_call(gemma3, 0)  # a global layer, under a (sliding) mask anyway
    with banded_attention(gemma3):
        out, _ = banded_sdpa_attention(module, query, key, value, mask, scaling=module.scaling)
        sliding = gemma3.model.layers[1].self_attn
        step, _ = banded_sdpa_attention(sliding, query[:, :, -1:], key, value, mask[:, :, -1:], scaling=module.scaling)
    assert torch.equal(out, sdpa_attention_forward(module, query, key, value, mask, scaling=module.scaling)[0])
    assert torch.equal(step, sdpa_attention_forward(sliding, query[:, :, -1:], key, value, mask[:, :, -1:],
                                                    scaling=module.scaling)[0])


def test_a_capture_keeps_each_layers_whole_queries_and_calls_the_bands(gemma3):
    ids = torch.randint(3, 128, (1, TOKENS), generator=torch.Generator().manual_seed(4))
    with capturing_queries(gemma3) as plain:
        expected = _forward(gemma3, ids).logits
    with capturing_queries(gemma3) as calls:
        inside = attention_implementation(gemma3)
        with banded_attention(gemma3):
            assert calls.wrapped == ATTENTION_NAME and attention_implementation(gemma3) == inside
            logits = _forward(gemma3, ids).logits
        assert calls.wrapped == "sdpa"
    assert sorted(calls.queries) == [0, 1, 2]
    assert torch.equal(calls.queries[0], plain.queries[0]) and torch.equal(calls.queries[1], plain.queries[1])
    torch.testing.assert_close(calls.queries[2], plain.queries[2], atol=2e-5, rtol=1e-5)  # after the banded layer
    torch.testing.assert_close(logits, expected, atol=2e-5, rtol=1e-5)


def _eager_gemma2():
    """gemma2 with sliding layers on eager attention (transformers' own default for it differs between versions)."""
    model = family_model("gemma2")
    model.set_attn_implementation("eager")
    return model


@pytest.mark.parametrize("model", [lambda: tiny_model(), _eager_gemma2], ids=["no sliding layers", "eager"])
def test_models_without_sliding_layers_or_not_on_sdpa_are_left_as_they_are(model):
    model = model()
    before = attention_implementation(model)
    with banded_attention(model):
        assert attention_implementation(model) == before
