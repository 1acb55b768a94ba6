"""Asymmetric min/max integer quantization in groups along one axis, with bit packing.

This is the arithmetic KIVI (Liu et al. 2024, arXiv 2402.02750) applies to the KV cache: each group
of `group_size` consecutive values along the quantized axis gets its own zero point (the group's minimum)
and scale ((max - min) / (2**bits - 1)); a value is stored as round((x - min) / scale), packed
`8 // bits` codes per byte. Rounding to the nearest level bounds the error of every value by half a scale
step, which tests/kvmethods/test_kivi.py checks against a brute-force reference. KIVI's choice of axis (keys
per channel: groups along the tokens, axis -2; values per token: groups along the channels, axis -1) is made
by the caller (kivi_layer.py); both keep the [..., tokens, channels] layout, so reading back needs no
transpose and writes straight into the caller's buffer (`dequantize(out=...)`).
Scales and zero points keep the cache's dtype, as in the reference (fp16 there), and count as bytes.

Packing: a group's codes are `8 // bits` planes: byte k of a group holds, in its bit field j, the group's
value j * (group_size * bits // 8) + k. Reading a code back is then one shift and one mask per plane over
whole machine words (the bytes of a row viewed as int64 where they divide), each plane a contiguous run of
the output; dequantize() is read on every decoding step of every layer (KIVI stores no full-precision copy),
so this is its hot path (docs/performance.md). The bytes stored are the same as any packing's.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

SUPPORTED_BITS = (2, 4, 8)
AXES = (-1, -2)
_WORDS = ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.uint8))


@functools.lru_cache(maxsize=64)
def _shifts(bits: int, dtype: torch.dtype, device: torch.device, trailing: int) -> torch.Tensor:
    """[per_byte, 1 x trailing]: the shift of each plane's bit field, in `dtype`."""
    return (torch.arange(8 // bits, device=device, dtype=dtype) * bits).view(-1, *([1] * trailing))


def _words(packed: torch.Tensor) -> tuple[torch.Tensor, int]:
    """packed (uint8, contiguous last axis) viewed as the widest integers whose size divides its last axis."""
    for size, dtype in _WORDS:
        if packed.shape[-1] % size == 0 and packed.storage_offset() % size == 0:
            return packed.view(dtype), size
    raise AssertionError("unreachable: a byte always divides")


def _field_mask(bits: int, size: int) -> int:
    """A mask keeping the low `bits` of every byte of a `size`-byte integer."""
    return int.from_bytes(bytes([(1 << bits) - 1]) * size, "little", signed=size > 1)


@dataclass
class QuantizedGroups:
    """A tensor quantized in groups along `axis`: packed codes plus per-group scale and zero point."""

    codes: torch.Tensor  # uint8, the quantized axis N packed to N * bits / 8 (planes within each group)
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

    def tokens(self, start: int, stop: int) -> QuantizedGroups:
        """The tokens [start, stop) (axis -2 of the original shape) as groups of their own, views of these: keys
        (axis -2) at whole groups only. Their dequantize() gives bit for bit those tokens of this one's: every
        value is rounded from its own code, scale and zero point alone."""
        if self.axis == -1:
            return QuantizedGroups(self.codes[..., start:stop, :], self.scale[..., start:stop, :],
                                   self.zero[..., start:stop, :], self.bits, self.group_size, self.axis)
        if start % self.group_size or stop % self.group_size:
            raise ValueError(f"tokens {start}:{stop} cut groups of {self.group_size} along the quantized axis")
        packed = self.bits * self.group_size // 8  # bytes a group of tokens packs into, per channel
        first, last = start // self.group_size, stop // self.group_size
        return QuantizedGroups(self.codes[..., first * packed: last * packed, :], self.scale[..., first:last, :],
                               self.zero[..., first:last, :], self.bits, self.group_size, self.axis)

    def levels(self) -> torch.Tensor:
        """The integer codes, unpacked (uint8, the original shape)."""
        if self.bits == 8:
            return self.codes
        trailing = self.axis == -1
        per_byte, group_bytes = 8 // self.bits, self.group_size * self.bits // 8
        codes = self.codes.contiguous()
        *lead, packed, width = codes.shape if not trailing else (*codes.shape, 1)
        groups = packed // group_bytes
        # [*lead, groups, 1, group_bytes(, width)]: the plane axis (1 here) is where the shifts broadcast
        columns = codes.view(*lead, groups, 1, group_bytes) if trailing else \
            codes.view(*lead, groups, 1, group_bytes, width)
        words, size = _words(columns)
        shifts = _shifts(self.bits, words.dtype, words.device, columns.dim() - len(lead) - 2)
        levels = ((words >> shifts) & _field_mask(self.bits, size)).view(torch.uint8)
        return levels.view(self.shape)

    @torch.no_grad()  # a quantized cache carries no gradient (rounding has none)
    def dequantize(self, out: torch.Tensor | None = None) -> torch.Tensor:
        """The values, written into `out` (a view of the original shape may be strided) when given.
        zero + level * scale in one addcmul (rounded once: the values are the same whatever the layout), which
        runs vectorized where at most one operand repeats along the innermost axis: keys (a scale per channel)
        in place over their levels, values (one scale per run of group_size channels) over their zero points."""
        levels = self.levels()
        shape = self.shape
        if out is None:
            out = self.scale.new_empty(shape)
        *lead, n, width = shape
        if self.axis == -2:  # [.., groups, group_size, width]: scale and zero broadcast along the tokens
            grouped = out.view(*lead, n // self.group_size, self.group_size, width)
            grouped.copy_(levels.view(grouped.shape))
            torch.addcmul(self.zero.unsqueeze(-2), grouped, self.scale.unsqueeze(-2), out=grouped)
        else:  # [.., n, groups, group_size]: the zero points written first, so that only the scale broadcasts
            grouped = out.view(*lead, n, width // self.group_size, self.group_size)
            grouped.copy_(self.zero.unsqueeze(-1).expand(grouped.shape))
            torch.addcmul(grouped, levels.view(grouped.shape).to(out.dtype), self.scale.unsqueeze(-1), out=grouped)
        return out


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
    per_byte = 8 // bits
    planes = levels.view(*lead, n // group_size, per_byte, group_size // per_byte, width)
    shifts = _shifts(bits, torch.uint8, x.device, 2)
    codes = (planes << shifts).sum(dim=-3, dtype=torch.uint8).view(*lead, n // per_byte, width)  # fields disjoint
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
