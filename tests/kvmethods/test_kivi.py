"""KIVI storage: the quantization error the bits and group size allow, the full-precision window kept
bit for bit, and bytes counted from the stored tensors equal to the analytic count."""

import pytest
import torch

from kvmethods import MethodError, get_method
from kvmethods.runtime.generation import generate
from kvmethods.storage.kivi_layer import KIVILayer, kivi_bytes
from kvmethods.storage.quantization import quantize_groups, quantized_bytes
from kvmethods.testing import tiny_model
from model_helpers import one_thread  # noqa: F401 (a module-scoped autouse fixture: applies here)

HEADS, HEAD_DIM = 2, 32


def brute_force(x: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(dequantized x, half a quantization step per value), one group at a time."""
    flat = x.reshape(-1, group_size)
    out, half_step = torch.empty_like(flat), torch.empty_like(flat)
    for g, group in enumerate(flat):
        low, high = float(group.min()), float(group.max())
        step = (high - low) / (2**bits - 1)
        levels = [min(max(round((float(v) - low) / step), 0), 2**bits - 1) if step else 0 for v in group]
        out[g] = torch.tensor([low + level * step for level in levels], dtype=x.dtype)
        half_step[g] = step / 2
    return out.reshape(x.shape), half_step.reshape(x.shape)


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("group_size", [8, 32])
def test_dequantized_values_match_a_brute_force_reference_within_half_a_step(bits, group_size):
    x = torch.randn(2, 3, 4 * group_size, generator=torch.Generator().manual_seed(bits + group_size)) * 3
    quantized = quantize_groups(x, bits, group_size)
    expected, half_step = brute_force(x, bits, group_size)
    restored = quantized.dequantize()
    torch.testing.assert_close(restored, expected, rtol=0, atol=1e-5)
    assert bool(((restored - x).abs() <= half_step + 1e-5).all())
    assert quantized.codes.dtype == torch.uint8 and quantized.codes.shape[-1] == x.shape[-1] * bits // 8


@pytest.mark.parametrize("bits", [2, 4])
def test_groups_along_the_tokens_match_the_reference_and_read_into_a_strided_buffer(bits):
    x = torch.randn(1, 2, 64, 8, generator=torch.Generator().manual_seed(bits)) * 3  # [.., tokens, channels]
    quantized = quantize_groups(x, bits, 16, axis=-2)  # per channel, groups of 16 tokens (KIVI's keys)
    expected, _ = brute_force(x.transpose(-1, -2).contiguous(), bits, 16)
    assert quantized.codes.shape == (1, 2, 64 * bits // 8, 8) and quantized.shape == x.shape
    buffer = torch.full((1, 2, 70, 8), 7.0)
    quantized.dequantize(out=buffer[..., :64, :])
    torch.testing.assert_close(buffer[..., :64, :], expected.transpose(-1, -2), rtol=0, atol=1e-5)
    assert bool((buffer[..., 64:, :] == 7.0).all())  # nothing written past the view


def test_fewer_bits_lose_more():
    x = torch.randn(4, 256, generator=torch.Generator().manual_seed(0))
    errors = [(quantize_groups(x, bits, 32).dequantize() - x).abs().mean() for bits in (2, 4, 8)]
    assert errors[0] > errors[1] > errors[2]


def prompt_cache(tokens: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    keys = torch.randn(1, HEADS, tokens, HEAD_DIM, generator=generator)
    values = torch.randn(1, HEADS, tokens, HEAD_DIM, generator=generator)
    return keys, values


@pytest.mark.parametrize("tokens", [20, 64, 100, 133])
def test_the_full_precision_window_is_kept_bit_for_bit(tokens):
    keys, values = prompt_cache(tokens)
    layer = KIVILayer.holding(keys, values, bits=2, group_size=16, residual=32)
    held_keys, held_values = layer.dequantized()
    full_keys = tokens % 32  # keys are quantized a whole window at a time
    full_values = min(tokens, 32)  # values: the last window
    assert torch.equal(held_keys[..., tokens - full_keys:, :], keys[..., tokens - full_keys:, :])
    assert torch.equal(held_values[..., tokens - full_values:, :], values[..., tokens - full_values:, :])
    assert layer.get_seq_length() == tokens
    if tokens > 32:  # and the older tokens really are quantized
        assert not torch.equal(held_values[..., :tokens - 32, :], values[..., :tokens - 32, :])


def test_decoding_quantizes_keys_a_window_at_a_time_and_values_token_by_token():
    keys, values = prompt_cache(40)
    layer = KIVILayer.holding(keys, values, bits=4, group_size=16, residual=32)
    new_keys, new_values = prompt_cache(30, seed=1)
    for step in range(30):
        seen_keys, seen_values = layer.update(new_keys[..., step:step + 1, :], new_values[..., step:step + 1, :])
        assert torch.equal(seen_keys[..., -1:, :], new_keys[..., step:step + 1, :])  # attended in full precision
        length = 41 + step
        assert layer.get_seq_length() == length == seen_keys.shape[-2]
        assert layer.keys.shape[-2] == length % 32 and layer.values.shape[-2] == 32
    assert torch.equal(layer.dequantized()[1][..., -32:, :], torch.cat([values, new_values], dim=-2)[..., -32:, :])


@pytest.mark.parametrize("bits", [2, 4])
@pytest.mark.parametrize("tokens", [5, 32, 77, 128, 300])
def test_physical_bytes_from_the_stored_tensors_equal_the_analytic_count(bits, tokens):
    keys, values = prompt_cache(tokens)
    layer = KIVILayer.holding(keys, values, bits=bits, group_size=16, residual=32)
    tensors = [layer.keys, layer.values]
    for store in (layer.quantized_keys, layer.quantized_values):
        if store is not None:
            tensors += [store.codes, store.scale, store.zero]
    counted = sum(t.numel() * t.element_size() for t in tensors)
    assert layer.stored_bytes() == counted == kivi_bytes(tokens, HEADS, HEAD_DIM, 4, bits, 16, 32)
    assert quantized_bytes(64, bits, 16, 4) == 64 * bits // 8 + 2 * 4 * 4


@pytest.mark.parametrize("params, fragment", [
    ({"bits": 3}, "'bits' must be 2 or 4"),
    ({"group_size": 64}, "'residual' (32) must be a multiple of group_size (64)"),
    ({"bits": 2, "group_size": 6, "residual": 30}, "group_size must be a positive multiple of 4"),
])
def test_unsupported_bits_and_group_sizes_are_method_errors(params, fragment):
    with pytest.raises(MethodError) as error:
        get_method("kivi", **params)
    assert fragment in str(error.value)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=3, qk_scale=4.0, hidden_size=128)  # head_dim 32


PROMPT = torch.randint(3, 256, (200,), generator=torch.Generator().manual_seed(5)).tolist()


def test_generation_stores_every_layer_quantized_and_reports_its_bytes(model):
    out = generate(model, get_method("kivi", bits=4), "r0", PROMPT, 150, 6, set(), "question_in_window")
    layers = model.config.num_hidden_layers
    assert out.kept_tokens_per_layer == [200] * layers
    assert out.kv_bytes_logical == out.kv_bytes_before
    assert out.kv_bytes_physical == layers * kivi_bytes(200, 2, 32, 4, 4, 32, 32) < out.kv_bytes_before / 3
    full = generate(model, get_method("full"), "r0", PROMPT, 150, 6, set(), "question_in_window")
    assert len(out.tokens) == len(full.tokens) == 6


def test_a_bad_group_size_for_the_model_is_a_one_line_error(model):
    with pytest.raises(MethodError, match="group_size 64 does not divide the model's head_dim 32"):
        generate(model, get_method("kivi", group_size=64, residual=64), "r0", PROMPT, 150, 2, set(),
                 "question_in_window")
