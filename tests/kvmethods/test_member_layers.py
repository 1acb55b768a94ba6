"""storage.batched.MemberLayers / MemberBuffer: a batch of storages of their own (KIVI) reads each member's keys and
values straight into one buffer shared by every layer; what each row returns is exactly what the member's layer
returns alone, and the padding after it is zeros whatever an earlier layer left there; a fork decodes without
changing the layer it came from."""

from __future__ import annotations

import torch

from kvmethods.storage.batched import MemberBuffer, MemberLayers
from kvmethods.storage.kivi_layer import KIVILayer

HEADS, DIM = 2, 16


def kivi(tokens: int, seed: int) -> KIVILayer:
    generator = torch.Generator().manual_seed(seed)
    keys, values = (torch.randn(1, HEADS, tokens, DIM, generator=generator) for _ in range(2))
    return KIVILayer.holding(keys, values, bits=2, group_size=8, residual=8)


def test_each_row_is_the_members_own_read_and_the_padding_is_zeros_after_a_longer_layer():
    # member 0's first layer is much longer than its second (as pyramidkv+kivi's would be): the shared buffer's
    # row 0 holds the first layer's read when the second layer is read into it
    members = [[kivi(70, 1), kivi(20, 2)], [kivi(40, 3), kivi(40, 4)]]  # [member][layer]
    buffer = MemberBuffer()
    layers = [MemberLayers([m[i].fork() for m in members], buffer) for i in range(2)]
    generator = torch.Generator().manual_seed(9)
    for step in range(3):
        new_keys, new_values = (torch.randn(2, HEADS, 1, DIM, generator=generator) for _ in range(2))
        for i, layer in enumerate(layers):
            keys, values = layer.update(new_keys, new_values)
            for b, member in enumerate(members):
                alone_keys, alone_values = member[i].update(new_keys[b: b + 1], new_values[b: b + 1])
                n = alone_keys.shape[-2]
                assert torch.equal(keys[b: b + 1, :, :n], alone_keys) and torch.equal(values[b: b + 1, :, :n],
                                                                                     alone_values)
                assert not keys[b, :, n:].any() and not values[b, :, n:].any(), (step, i, b)
    mask = layers[1].attention_mask(1, HEADS)  # member 0 sees its 23 + 1 tokens of the second layer, no padding
    assert mask.shape == (2, 1, 1, 44) and int(mask[0].sum()) == 24 and int(mask[1].sum()) == 44


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
