"""storage.batched.MemberLayers / MemberBuffer: a batch of storages of their own (KIVI, ThinK) reads each member's keys
and values into its layer's working buffer, kept between steps (each member writes only what changed: KIVI's newly
quantized groups and its window); what each row returns is exactly what the member's layer returns alone, step after
step, through its window filling and being quantized, and the padding after it is zeros; a fork decodes without
changing the layer it came from."""

from __future__ import annotations

import pytest
import torch

from kvmethods.storage.batched import MemberBuffer, MemberLayers
from kvmethods.storage.kivi_layer import KIVILayer
from kvmethods.storage.quantization import quantize_groups
from kvmethods.storage.think import ChannelPrunedLayer

HEADS, DIM = 2, 16


def kivi(tokens: int, seed: int, channels: torch.Tensor | None = None) -> KIVILayer:
    generator = torch.Generator().manual_seed(seed)
    keys, values = (torch.randn(1, HEADS, tokens, DIM, generator=generator) for _ in range(2))
    return KIVILayer.holding(keys, values, bits=2, group_size=8, residual=8, channels=channels)


def think(tokens: int, seed: int) -> ChannelPrunedLayer:
    generator = torch.Generator().manual_seed(seed)
    keys, values = (torch.randn(1, HEADS, tokens, DIM, generator=generator) for _ in range(2))
    channels = torch.stack([torch.randperm(DIM, generator=generator)[:10].sort().values for _ in range(HEADS)])
    return ChannelPrunedLayer(keys, values, channels.unsqueeze(0), recent=4)


THIN = torch.tensor([[[0, 3, 5, 6, 9, 12, 13, 15], [1, 2, 4, 7, 8, 10, 11, 14]]])
MEMBERS = {  # [member][layer]: member 0's first layer much longer than its second (as pyramidkv+kivi's would be)
    "kivi": lambda: [[kivi(70, 1), kivi(20, 2)], [kivi(43, 3), kivi(40, 4)]],
    "think+kivi": lambda: [[kivi(70, 1, THIN), kivi(20, 2, THIN)], [kivi(43, 3, THIN), kivi(40, 4, THIN)]],
    "think": lambda: [[think(70, 1), think(20, 2)], [think(43, 3), think(40, 4)]],
}


@pytest.mark.parametrize("kind", sorted(MEMBERS))
@pytest.mark.parametrize("new", [1, 5])
@pytest.mark.parametrize("mirror", [None, torch.float64], ids=["own-dtype", "wider-mirror"])
def test_each_row_is_the_members_own_read_step_after_step_and_the_padding_is_zeros(kind, new, mirror):
    # 20 steps of one token (or 5) fill each member's 8-token window twice or more: keys are quantized while the
    # batch decodes, and the rows (which the buffer keeps between steps) must still read as each layer alone.
    # With a wider mirror (a half-precision batch's float32 working copy) the rows read are the member's own
    # values, rounded as alone, then widened: not a more precise dequantization
    members = MEMBERS[kind]()
    layers = [MemberLayers([m[i].fork() for m in members], MemberBuffer(room=3, dtype=mirror)) for i in range(2)]
    generator = torch.Generator().manual_seed(9)
    for step in range(20):
        new_keys, new_values = (torch.randn(2, HEADS, new, DIM, generator=generator) for _ in range(2))
        for i, layer in enumerate(layers):
            keys, values = layer.update(new_keys, new_values)
            for b, member in enumerate(members):
                alone_keys, alone_values = member[i].update(new_keys[b: b + 1], new_values[b: b + 1])
                n = alone_keys.shape[-2]
                assert keys.dtype == values.dtype == (mirror or alone_keys.dtype)
                assert torch.equal(keys[b: b + 1, :, :n], alone_keys.to(keys.dtype)) and \
                    torch.equal(values[b: b + 1, :, :n], alone_values.to(values.dtype)), (step, i, b)
                assert not keys[b, :, n:].any() and not values[b, :, n:].any(), (step, i, b)
        if step == 9:  # a member leaves: the rows kept keep what they hold
            for layer in layers:
                layer.keep_rows(torch.tensor([1]))
            members = members[1:]
            new_keys, new_values = new_keys[1:], new_values[1:]
    mask = layers[1].attention_mask(1, HEADS)  # the one member left sees all of its tokens
    assert mask.shape == (1, 1, 1, 40 + 20 * new + 1) and bool(mask.all())


def test_a_member_dequantizes_each_group_once_in_a_batch():
    # the store is read incrementally: after the first step only groups quantized since are dequantized
    layer = kivi(64, 7)
    calls = []
    original = type(layer.quantized_keys).dequantize

    def counting(self, out=None):
        calls.append(self.shape[-2])  # tokens
        return original(self, out=out)

    batch = MemberLayers([layer.fork()], MemberBuffer())
    type(layer.quantized_keys).dequantize = counting
    try:
        for _ in range(9):
            batch.update(torch.randn(1, HEADS, 1, DIM), torch.randn(1, HEADS, 1, DIM))
    finally:
        type(layer.quantized_keys).dequantize = original
    # step 1: 64 keys and 56 values (8 in the window); then one value a step (each leaving the window); at step 9
    # the 8 keys quantized when the window filled at step 8
    assert calls[:2] == [64, 56] and calls[2:] == [1] * 7 + [8, 1], calls


def test_tokens_of_quantized_groups_dequantize_as_the_whole():
    x = torch.randn(1, HEADS, 48, DIM)
    for axis, (start, stop) in ((-2, (16, 40)), (-1, (5, 31))):
        groups = quantize_groups(x, 2, 8, axis=axis)
        assert torch.equal(groups.tokens(start, stop).dequantize(), groups.dequantize()[..., start:stop, :])
    with pytest.raises(ValueError, match="cut groups"):
        quantize_groups(x, 2, 8, axis=-2).tokens(4, 40)


def test_a_fork_decodes_without_changing_the_layer_it_came_from():
    layer = kivi(50, 5)
    before = [t.clone() for t in layer.dequantized()]
    stored = layer.stored_bytes()
    fork = layer.fork()
    generator = torch.Generator().manual_seed(6)
    for _ in range(20):  # past a whole window: keys are quantized again, values token by token
        fork.update(*(torch.randn(1, HEADS, 1, DIM, generator=generator) for _ in range(2)))
    assert fork.get_seq_length() == 70 and layer.get_seq_length() == 50
    assert layer.stored_bytes() == stored
    assert all(torch.equal(a, b) for a, b in zip(before, layer.dequantized()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_batch_sizing_counts_a_kivi_row_as_a_dense_row_its_working_buffer_fits_in(dtype):
    # a KIVI member stores codes (what the records report), but in a batch its rows hold dequantized keys and values
    # for every layer: DecodeBatching sizes a member by that dense row, which must cover the buffers the batch keeps;
    # in bfloat16 on CPU the batch also mirrors them in float32 (gqa_attention.decoding_cache_dtype), counted too
    from pytest_kvbench.engine.decode_batching import _cache_bytes, _member_bytes

    def layer(tokens, seed):
        generator = torch.Generator().manual_seed(seed)
        keys, values = (torch.randn(1, HEADS, tokens, DIM, generator=generator).to(dtype) for _ in range(2))
        return KIVILayer.holding(keys, values, bits=2, group_size=8, residual=8)

    class State:
        def __init__(self, tokens, seed):
            self.cache = type("Cache", (), {"layers": [layer(tokens, seed), layer(tokens, seed + 1)]})()
            self.next_position = tokens

    states = [State(70, 1), State(43, 3)]
    stored = sum(layer.stored_bytes() for layer in states[0].cache.layers)
    per_element = 4 if dtype == torch.float32 else 2 + 4  # its own row (+ the float32 mirror)
    dense = 2 * HEADS * 70 * 2 * DIM * per_element  # 2 layers x heads x tokens x (K + V)
    assert _cache_bytes(states[0]) == dense and stored < dense / 2
    new_tokens = 12
    member = _member_bytes(states, new_tokens, 0, 1) - 4 * (new_tokens + 2)  # the cache's part, not the log-probs
    mirror = None if dtype == torch.float32 else torch.float32
    batch = [MemberLayers([s.cache.layers[i].fork() for s in states], MemberBuffer(room=new_tokens, dtype=mirror))
             for i in range(2)]
    for _ in range(new_tokens):
        for layer in batch:
            layer.update(torch.randn(2, HEADS, 1, DIM).to(dtype), torch.randn(2, HEADS, 1, DIM).to(dtype))
    held = sum(t.numel() * t.element_size() for layer in batch
               for t in (layer.buffer.keys, layer.buffer.values, *(layer.buffer.mirror or ())))
    assert (layer.buffer.mirror is not None) == (dtype == torch.bfloat16)
    assert held <= len(states) * member, (held, member)
