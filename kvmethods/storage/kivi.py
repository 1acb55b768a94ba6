"""KIVI (Liu et al. 2024, "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache", arXiv 2402.02750).

Keys have outlier channels, values do not: KIVI quantizes keys per channel (groups of tokens within a
channel) and values per token (groups of channels within a token), with asymmetric min/max integer
quantization, and keeps the most recent tokens in full precision until a group of them is complete.
It evicts nothing; composed with an eviction method (`snapkv+kivi`, composition.py) it stores the kept
tokens this way. Defaults follow the reference code's example (github.com/jy-yuan/KIVI, example.py:
k_bits = v_bits = 2, group_size = 32, residual_length = 32); the paper's LongBench runs use a window of
128 (`residual=128`). The storage is kivi_layer.KIVILayer; the arithmetic is quantization.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.base import Method, param
from ..core.capabilities import Capability
from ..core.errors import MethodError
from .kivi_layer import KIVILayer, kivi_bytes
from .quantization import check_grouping

KIVI_BITS = (2, 4)  # what the reference kernels support for keys and values


@dataclass
class KIVI(Method):
    name = "kivi"
    paper = "Liu et al. 2024, KIVI (arXiv 2402.02750)"
    capabilities = Capability.OWN_STORAGE | Capability.TAKES_CHANNELS

    bits: int = param(2, "bits per key and value (2 or 4)")
    group_size: int = param(32, "values per quantization group (tokens for keys, channels for values)", minimum=1)
    residual: int = param(32, "recent tokens kept in full precision; a multiple of group_size", minimum=1)

    def check(self) -> None:
        if self.bits not in KIVI_BITS:
            raise MethodError(f"kivi: parameter 'bits' must be 2 or 4, got {self.bits}")
        try:
            check_grouping(self.bits, self.group_size)
        except ValueError as error:
            raise MethodError(f"kivi: {error}") from None
        if self.residual % self.group_size:
            raise MethodError(f"kivi: parameter 'residual' ({self.residual}) must be a multiple of group_size "
                              f"({self.group_size}): keys are quantized a whole window at a time")

    def storage_layer(self, keys: torch.Tensor, values: torch.Tensor, queries=None,
                      channels: torch.Tensor | None = None) -> KIVILayer:
        if keys.shape[-1] % self.group_size:
            raise MethodError(f"kivi: group_size {self.group_size} does not divide the model's head_dim "
                              f"{keys.shape[-1]} (values are grouped along channels)")
        return KIVILayer.holding(keys, values, self.bits, self.group_size, self.residual, channels)

    def stored_bytes(self, tokens: int, heads: int, head_dim: int, element_size: int,
                     kept_channels: int | None = None) -> int:
        return kivi_bytes(tokens, heads, head_dim, element_size, self.bits, self.group_size, self.residual,
                          kept_channels)
