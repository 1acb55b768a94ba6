"""ThinK: key channels scored by ||Q_obs[:, j] K[:, j]^T||_F, the lowest pruned per KV head, as the reference
chooses them; the stored keys keep the other channels bit for bit, the last `recent` prompt keys keep every
channel, and no pruning gives exactly the full cache's outputs."""

import pytest
import torch

from kvmethods import get_method
from kvmethods.runtime.generation import generate
from kvmethods.testing import tiny_model
from kvmethods.storage.think import ChannelPrunedLayer
from model_helpers import one_thread  # noqa: F401 (a module-scoped autouse fixture: applies here)

PROMPT = torch.randint(3, 256, (160,), generator=torch.Generator().manual_seed(4)).tolist()


def test_channel_scores_are_the_frobenius_norm_of_each_channels_logit_contribution():
    generator = torch.Generator().manual_seed(0)
    queries, keys = torch.randn(1, 4, 8, 16, generator=generator), torch.randn(1, 2, 30, 16, generator=generator)
    scores = get_method("think").channel_scores(queries, keys)
    for head in range(2):
        group = queries[0, 2 * head:2 * head + 2]  # the KV head's two query heads
        for j in range(16):
            logits = group[:, :, j].reshape(-1, 1) @ keys[0, head, :, j].reshape(1, -1)
            assert float(scores[0, head, j]) == pytest.approx(float(torch.linalg.matrix_norm(logits)), rel=1e-5)


def test_the_layer_keeps_the_chosen_channels_bit_for_bit_and_zeroes_the_rest():
    keys, values = torch.randn(1, 2, 10, 8), torch.randn(1, 2, 10, 8)
    channels = torch.tensor([[[0, 3, 5], [1, 2, 7]]])
    layer = ChannelPrunedLayer(keys, values, channels)
    restored, held_values = layer.update(torch.ones(1, 2, 1, 8), torch.ones(1, 2, 1, 8))
    for head, kept in enumerate(channels[0].tolist()):
        assert torch.equal(restored[0, head, :10, kept], keys[0, head][:, kept])
        pruned = [c for c in range(8) if c not in kept]
        assert bool((restored[0, head, :10, pruned] == 0).all())
    assert torch.equal(restored[..., 10:, :], torch.ones(1, 2, 1, 8))  # later tokens keep every channel
    assert torch.equal(held_values[..., :10, :], values) and layer.get_seq_length() == 11
    assert layer.stored_bytes() == (2 * 10 * 3 + 2 * 1 * 8 + 2 * 11 * 8) * 4 + 2 * 3 * 8


def reference_kept_channels(queries: torch.Tensor, keys: torch.Tensor, ratio: float) -> torch.Tensor:
    """The ThinK reference's choice (ThinK_flash/src/kv_pruning_utils.py lines 13-21), one query head per KV
    head: mean squares of the last 32 queries times those of the keys, the int(D x ratio) lowest pruned."""
    score = queries[..., -32:, :].pow(2).mean(dim=2) * keys.pow(2).mean(dim=2)
    pruned = score.topk(int(keys.shape[-1] * ratio), dim=-1, largest=False).indices
    kept = torch.ones_like(score, dtype=torch.bool).scatter_(-1, pruned, False)
    return kept.nonzero()[:, -1].view(*score.shape[:2], -1)


@pytest.mark.parametrize("ratio", [0.4, 0.5, 0.3])
def test_kept_channels_match_the_reference_formula_and_defaults(ratio):
    generator = torch.Generator().manual_seed(int(ratio * 10))
    queries, keys = torch.randn(1, 3, 40, 16, generator=generator), torch.randn(1, 3, 50, 16, generator=generator)
    method = get_method("think", pruning_ratio=ratio)
    assert torch.equal(method.kept_channel_indices(keys, queries[..., -32:, :]),
                       reference_kept_channels(queries, keys, ratio))
    assert get_method("think").params() == {"pruning_ratio": 0.4, "window": 32, "recent": 32}


@pytest.mark.parametrize("tokens", [3, 10])
def test_the_recent_prompt_keys_keep_every_channel(tokens):
    keys, values = torch.randn(1, 2, tokens, 8), torch.randn(1, 2, tokens, 8)
    channels = torch.tensor([[[0, 3, 5], [1, 2, 7]]])
    layer = ChannelPrunedLayer(keys, values, channels, recent=4)
    restored, _ = layer.update(torch.ones(1, 2, 1, 8), torch.ones(1, 2, 1, 8))
    whole = min(4, tokens)
    assert torch.equal(restored[..., tokens - whole:tokens, :], keys[..., tokens - whole:, :])
    assert bool((restored[0, 0, :tokens - whole, [1, 2, 4, 6, 7]] == 0).all())
    expected = get_method("think", pruning_ratio=0.625, recent=4).stored_bytes(tokens, 2, 8, 4)
    assert layer.stored_bytes() - 2 * 1 * 8 * 4 * 2 == expected  # less the decoded token's key and value


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=3, qk_scale=4.0)


def test_no_pruning_is_exactly_the_full_cache(model):
    full = generate(model, get_method("full"), "r0", PROMPT, 120, 6, set(), "query_agnostic", return_logprobs=True)
    same = generate(model, get_method("think", pruning_ratio=0.0), "r0", PROMPT, 120, 6, set(), "query_agnostic",
                    return_logprobs=True)
    assert same.tokens == full.tokens and torch.equal(same.logprobs, full.logprobs)


@pytest.mark.parametrize("spec", ["think", "snapkv+think"])
def test_pruned_keys_shrink_the_stored_bytes_as_the_analytic_count_says(model, spec):
    method = get_method(spec, pruning_ratio=0.5)
    out = generate(model, method, "64", PROMPT, 160, 3, set(), "question_in_window")
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    kept = out.kept_tokens_per_layer[0]
    assert kept == (160 if spec == "think" else 64)
    expected = method.stored_bytes(kept, config.num_key_value_heads, head_dim, 4) * config.num_hidden_layers
    assert out.kv_bytes_physical == expected < out.kv_bytes_logical
