"""Asymmetric min/max integer quantization in groups along the last axis, with bit packing.

This is the arithmetic KIVI (Liu et al. 2024, arXiv 2402.02750) applies to the KV cache: each group
of `group_size` consecutive values along the last axis gets its own zero point (the group's minimum)
and scale ((max - min) / (2**bits - 1)); a value is stored as round((x - min) / scale), packed
`8 // bits` codes per byte. Rounding to the nearest level bounds the error of every value by half a
scale step, which tests/test_quantization.py checks against a brute-force reference. KIVI's choice of
axis (keys per channel, values per token) is made by the caller (kivi_layer.py), which transposes.
Scales and zero points keep the cache's dtype, as in the reference (fp16 there), and count as bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_BITS = (2, 4, 8)


@dataclass
class QuantizedGroups:
    """A tensor quantized in groups along its last axis: packed codes plus per-group scale and zero point."""

    codes: torch.Tensor  # uint8 [..., N * bits / 8]
    scale: torch.Tensor  # [..., N / group_size], the original dtype
    zero: torch.Tensor  # [..., N / group_size], the group minimum
    bits: int
    group_size: int

    @property
    def length(self) -> int:
        """N, the number of values along the quantized axis."""
        return self.codes.shape[-1] * (8 // self.bits)

    def stored_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.zero))

    def dequantize(self) -> torch.Tensor:
        per_byte = 8 // self.bits
        shifts = torch.arange(per_byte, device=self.codes.device, dtype=torch.uint8) * self.bits
        levels = (self.codes.unsqueeze(-1) >> shifts) & ((1 << self.bits) - 1)  # [..., N/per_byte, per_byte]
        levels = levels.reshape(*self.codes.shape[:-1], -1, self.group_size).to(self.scale.dtype)
        values = levels * self.scale.unsqueeze(-1) + self.zero.unsqueeze(-1)
        return values.reshape(*self.codes.shape[:-1], -1)


def check_grouping(bits: int, group_size: int) -> None:
    """ValueError unless the bits are supported and a group packs into whole bytes."""
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {', '.join(map(str, SUPPORTED_BITS))}, got {bits}")
    if group_size < 1 or group_size % (8 // bits):
        raise ValueError(f"group_size must be a positive multiple of {8 // bits} at {bits} bits, got {group_size}")


def quantize_groups(x: torch.Tensor, bits: int, group_size: int) -> QuantizedGroups:
    """Quantize x [..., N] (N a multiple of group_size) in groups of group_size along the last axis."""
    check_grouping(bits, group_size)
    if x.shape[-1] % group_size:
        raise ValueError(f"the quantized axis ({x.shape[-1]}) must be a multiple of group_size {group_size}")
    groups = x.reshape(*x.shape[:-1], -1, group_size)
    zero = groups.amin(dim=-1)
    top = (1 << bits) - 1
    scale = ((groups.amax(dim=-1) - zero) / top).clamp_min(torch.finfo(x.dtype).tiny)
    levels = ((groups - zero.unsqueeze(-1)) / scale.unsqueeze(-1)).round_().clamp_(0, top).to(torch.uint8)
    per_byte = 8 // bits
    levels = levels.reshape(*x.shape[:-1], -1, per_byte)
    shifts = torch.arange(per_byte, device=x.device, dtype=torch.uint8) * bits
    codes = (levels << shifts).sum(dim=-1, dtype=torch.uint8)  # the shifted fields do not overlap
    return QuantizedGroups(codes, scale, zero, bits, group_size)


def quantized_bytes(values: int, bits: int, group_size: int, element_size: int) -> int:
    """Analytic bytes of `values` quantized values: packed codes plus a scale and a zero point per group."""
    return values * bits // 8 + 2 * (values // group_size) * element_size


def concatenated(first: QuantizedGroups | None, second: QuantizedGroups, dim: int) -> QuantizedGroups:
    """second appended to first along `dim` (a leading axis, or the quantized axis when groups align)."""
    if first is None:
        return second
    parts = [torch.cat([a, b], dim=dim) for a, b in
             ((first.codes, second.codes), (first.scale, second.scale), (first.zero, second.zero))]
    return QuantizedGroups(*parts, first.bits, first.group_size)
