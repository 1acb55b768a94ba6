"""ThinK with KIVI (`think+kivi`, `snapkv+think+kivi`): the thin keys are quantized, the full-precision window
keeps every channel. What attention sees equals a brute-force reference (prune the channels, then quantize and
dequantize) within the quantization bound, and the bytes counted from the stored tensors equal the analytic count."""

import pytest
import torch
import torch.nn.functional as F

from kvmethods import get_method
from kvmethods.runtime.generation import generate
from kvmethods.storage.kivi_layer import kivi_bytes
from kvmethods.testing import tiny_model
from model_helpers import one_thread  # noqa: F401 (a module-scoped autouse fixture: applies here)
from test_kivi import brute_force
from test_think import reference_kept_channels

HEADS, HEAD_DIM, GROUP, RESIDUAL = 2, 32, 16, 32


def prompt(tokens: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(1, HEADS, n, HEAD_DIM, generator=generator) for n in (tokens, tokens, 32)]


def brute_force_cache(keys, values, queries, bits, ratio):
    """(keys, values, half a step per value) as think+kivi should hold them, computed one group at a time."""
    tokens = keys.shape[2]
    kept = reference_kept_channels(queries, keys, ratio)
    pruned = torch.zeros_like(keys).scatter_(-1, kept.unsqueeze(2).expand(-1, -1, tokens, -1),
                                             keys.gather(-1, kept.unsqueeze(2).expand(-1, -1, tokens, -1)))
    n_keys, n_values = tokens // RESIDUAL * RESIDUAL, max(tokens - RESIDUAL, 0)
    expected_keys, expected_values = keys.clone(), values.clone()
    key_steps, value_steps = torch.zeros_like(keys), torch.zeros_like(values)
    if n_keys:  # per channel, groups of GROUP tokens
        dequantized, step = brute_force(pruned[..., :n_keys, :].transpose(-1, -2).contiguous(), bits, GROUP)
        expected_keys[..., :n_keys, :], key_steps[..., :n_keys, :] = dequantized.transpose(-1, -2), step.transpose(-1, -2)
    if n_values:  # per token, groups of GROUP channels
        dequantized, step = brute_force(values[..., :n_values, :].contiguous(), bits, GROUP)
        expected_values[..., :n_values, :], value_steps[..., :n_values, :] = dequantized, step
    return expected_keys, expected_values, key_steps, value_steps, pruned, kept


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("tokens", [20, 64, 100])
def test_attention_over_the_composed_cache_equals_the_brute_force_reference(bits, tokens):
    keys, values, queries = prompt(tokens, seed=bits + tokens)
    method = get_method("think+kivi", bits=bits, group_size=GROUP, residual=RESIDUAL, pruning_ratio=0.5)
    layer = method.storage_layer(keys, values, queries)
    expected_keys, expected_values, key_steps, value_steps, pruned, kept = brute_force_cache(
        keys, values, queries, bits, 0.5)
    new_key, new_value, query = (torch.randn(1, HEADS, 1, HEAD_DIM, generator=torch.Generator().manual_seed(9))
                                 for _ in range(3))
    held_keys, held_values = layer.update(new_key, new_value)
    torch.testing.assert_close(held_keys[..., :tokens, :], expected_keys, rtol=0, atol=1e-5)
    torch.testing.assert_close(held_values[..., :tokens, :], expected_values, rtol=0, atol=1e-5)
    n_keys = tokens // RESIDUAL * RESIDUAL
    assert bool(((held_keys[..., :n_keys, :] - pruned[..., :n_keys, :]).abs() <= key_steps[..., :n_keys, :] + 1e-5).all())
    assert bool(((held_values[..., :tokens, :] - values).abs() <= value_steps + 1e-5).all())
    assert torch.equal(held_keys[..., n_keys:tokens, :], keys[..., n_keys:, :])  # the window: every channel
    assert torch.equal(layer.channels, kept)
    reference_keys = torch.cat([expected_keys, new_key], dim=-2)
    reference_values = torch.cat([expected_values, new_value], dim=-2)
    torch.testing.assert_close(F.scaled_dot_product_attention(query, held_keys, held_values),
                               F.scaled_dot_product_attention(query, reference_keys, reference_values),
                               rtol=0, atol=1e-4)


def test_keys_leaving_the_window_while_decoding_are_thinned_with_the_same_channels():
    keys, values, queries = prompt(40)
    layer = get_method("think+kivi", bits=4, group_size=GROUP, residual=RESIDUAL).storage_layer(keys, values, queries)
    pruned = [c for c in range(HEAD_DIM) if c not in layer.channels[0, 0].tolist()]
    new_keys = torch.randn(1, HEADS, 24, HEAD_DIM)
    for step in range(24):  # 8 + 24 window keys: one more window gets quantized at the last step
        held_keys, _ = layer.update(new_keys[..., step:step + 1, :], new_keys[..., step:step + 1, :])
        assert torch.equal(held_keys[..., -1:, :], new_keys[..., step:step + 1, :])  # attended in full first
    held_keys, _ = layer.dequantized()
    assert layer.keys.shape[-2] == 0 and held_keys.shape[-2] == 64
    assert bool((held_keys[0, 0, :, pruned] == 0).all())


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("tokens", [5, 32, 77, 300])
def test_bytes_from_the_stored_tensors_equal_the_analytic_count(bits, tokens):
    keys, values, queries = prompt(tokens)
    method = get_method("think+kivi", bits=bits, group_size=GROUP, residual=RESIDUAL)
    layer = method.storage_layer(keys, values, queries)
    tensors = [layer.keys, layer.values, layer.channels]
    for store in (layer.quantized_keys, layer.quantized_values):
        if store is not None:
            tensors += [store.codes, store.scale, store.zero]
    counted = sum(t.numel() * t.element_size() for t in tensors)
    thin = HEAD_DIM - int(HEAD_DIM * 0.4)
    assert layer.stored_bytes() == counted == method.stored_bytes(tokens, HEADS, HEAD_DIM, 4) \
        == kivi_bytes(tokens, HEADS, HEAD_DIM, 4, bits, GROUP, RESIDUAL, kept_channels=thin)
    if tokens >= RESIDUAL:  # thinner keys: fewer bytes than kivi alone
        assert counted < get_method("kivi", bits=bits, group_size=GROUP).stored_bytes(tokens, HEADS, HEAD_DIM, 4)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=3, qk_scale=4.0, hidden_size=128)  # head_dim 32


PROMPT = torch.randint(3, 256, (200,), generator=torch.Generator().manual_seed(5)).tolist()


@pytest.mark.parametrize("spec, budget, kept", [("think+kivi", "r0", 200), ("snapkv+think+kivi", "64", 64)])
def test_generation_reports_the_bytes_the_composed_layers_hold(model, spec, budget, kept):
    method = get_method(spec, bits=4)
    out = generate(model, method, budget, PROMPT, 150, 4, set(), "question_in_window")
    config = model.config
    assert out.kept_tokens_per_layer == [kept] * config.num_hidden_layers
    expected = method.stored_bytes(kept, config.num_key_value_heads, HEAD_DIM, 4) * config.num_hidden_layers
    assert out.kv_bytes_physical == expected
    assert len(out.tokens) == 4


def test_thinner_keys_buy_more_tokens_under_a_byte_budget(model):
    outs = {spec: generate(model, get_method(spec, bits=4), "m0.15", PROMPT, 200, 1, set(), "question_in_window")
            for spec in ("snapkv+kivi", "snapkv+think+kivi")}
    kept = {spec: out.kept_tokens_per_layer[0] for spec, out in outs.items()}
    assert kept["snapkv+kivi"] < kept["snapkv+think+kivi"] < 200
    assert all(0 < out.kv_bytes_physical <= out.kv_bytes_budget for out in outs.values())
