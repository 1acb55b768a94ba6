"""Asymmetric min/max integer quantization in groups along one axis, with bit packing.

This is the arithmetic KIVI (Liu et al. 2024, arXiv 2402.02750) applies to the KV cache: each group
of `group_size` consecutive values along the quantized axis gets its own zero point (the group's minimum)
and scale ((max - min) / (2**bits - 1)); a value is stored as round((x - min) / scale), packed
`8 // bits` consecutive codes per byte. Rounding to the nearest level bounds the error of every value by
half a scale step, which tests/kvmethods/test_kivi.py checks against a brute-force reference. KIVI's choice
of axis (keys per channel: groups along the tokens, axis -2; values per token: groups along the channels,
axis -1) is made by the caller (kivi_layer.py); both keep the [..., tokens, channels] layout, so reading
back needs no transpose and writes straight into the caller's buffer (`dequantize(out=...)`).
Scales and zero points keep the cache's dtype, as in the reference (fp16 there), and count as bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_BITS = (2, 4, 8)
AXES = (-1, -2)


def _shifts(bits: int, device) -> torch.Tensor:
    """[per_byte, 1]: where each of a byte's codes sits."""
    return (torch.arange(8 // bits, device=device, dtype=torch.uint8) * bits).unsqueeze(-1)


@dataclass
class QuantizedGroups:
    """A tensor quantized in groups along `axis`: packed codes plus per-group scale and zero point."""

    codes: torch.Tensor  # uint8, the quantized axis N packed to N * bits / 8
    scale: torch.Tensor  # the quantized axis N reduced to N / group_size, the original dtype
    zero: torch.Tensor  # as scale: the group minimum
    bits: int
    group_size: int
    axis: int = -1

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of the tensor that was quantized."""
        shape = list(self.codes.shape)
        shape[self.axis] *= 8 // self.bits
        return tuple(shape)

    @property
    def length(self) -> int:
        """N, the number of values along the quantized axis."""
        return self.shape[self.axis]

    def stored_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scale, self.zero))

    @torch.no_grad()  # a quantized cache carries no gradient (rounding has none)
    def dequantize(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The values, written into `out` (a view of the original shape may be strided) when given."""
        trailing = self.axis == -1  # grouped along the last axis: work on a trailing axis of size 1
        codes, scale, zero = (t.unsqueeze(-1) if trailing else t for t in (self.codes, self.scale, self.zero))
        levels = (codes.unsqueeze(-2) >> _shifts(self.bits, codes.device)) & ((1 << self.bits) - 1)
        *lead, packed, per_byte, width = levels.shape
        grouped = (*lead, packed * per_byte // self.group_size, self.group_size, width)
        if out is None:
            out = scale.new_empty(*lead, packed * per_byte, width)
        elif trailing:
            out = out.unsqueeze(-1)
        torch.addcmul(zero.unsqueeze(-2), levels.view(grouped).to(scale.dtype), scale.unsqueeze(-2),
                      out=out.view(grouped))
        return out.squeeze(-1) if trailing else out


def check_grouping(bits: int, group_size: int) -> None:
    """ValueError unless the bits are supported and a group packs into whole bytes."""
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {', '.join(map(str, SUPPORTED_BITS))}, got {bits}")
    if group_size < 1 or group_size % (8 // bits):
        raise ValueError(f"group_size must be a positive multiple of {8 // bits} at {bits} bits, got {group_size}")


@torch.no_grad()
def quantize_groups(x: torch.Tensor, bits: int, group_size: int, axis: int = -1) -> QuantizedGroups:
    """Quantize x in groups of group_size along `axis` (-1 or -2; its length a multiple of group_size)."""
    check_grouping(bits, group_size)
    if axis not in AXES:
        raise ValueError(f"axis must be -1 or -2, got {axis}")
    if x.shape[axis] % group_size:
        raise ValueError(f"the quantized axis ({x.shape[axis]}) must be a multiple of group_size {group_size}")
    trailing = axis == -1
    columns = x.unsqueeze(-1) if trailing else x  # [..., N, width]: groups along N
    *lead, n, width = columns.shape
    groups = columns.reshape(*lead, n // group_size, group_size, width)
    zero = groups.amin(dim=-2)
    top = (1 << bits) - 1
    scale = ((groups.amax(dim=-2) - zero) / top).clamp_min(torch.finfo(x.dtype).tiny)
    levels = ((groups - zero.unsqueeze(-2)) / scale.unsqueeze(-2)).round_().clamp_(0, top).to(torch.uint8)
    levels = levels.reshape(*lead, n // (8 // bits), 8 // bits, width)
    codes = (levels << _shifts(bits, x.device)).sum(dim=-2, dtype=torch.uint8)  # the fields do not overlap
    if trailing:
        codes, scale, zero = codes.squeeze(-1), scale.squeeze(-1), zero.squeeze(-1)
    return QuantizedGroups(codes, scale, zero, bits, group_size, axis)


def quantized_bytes(values: int, bits: int, group_size: int, element_size: int) -> int:
    """Analytic bytes of `values` quantized values: packed codes plus a scale and a zero point per group."""
    return values * bits // 8 + 2 * (values // group_size) * element_size


def concatenated(first: QuantizedGroups | None, second: QuantizedGroups, dim: int) -> QuantizedGroups:
    """second appended to first along `dim` (a leading axis, or the quantized axis when groups align)."""
    if first is None:
        return second
    parts = [torch.cat([a, b], dim=dim) for a, b in
             ((first.codes, second.codes), (first.scale, second.scale), (first.zero, second.zero))]
    return QuantizedGroups(*parts, first.bits, first.group_size, first.axis)
