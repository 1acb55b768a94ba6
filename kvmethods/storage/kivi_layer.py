"""The KIVI cache layer: keys quantized per channel, values per token, recent tokens in full precision.

A transformers cache layer (a `DynamicLayer` subclass plugged into `DynamicCache.layers`, the public
Cache API; no attention forward is touched). What it stores follows the KIVI reference (Liu et al.
2024, arXiv 2402.02750, github.com/jy-yuan/KIVI, models/llama_kivi.py):

- keys: quantized in groups of `group_size` tokens per channel, `residual` tokens at a time: after the
  prompt, the first T - T % residual keys are quantized and T % residual stay full precision; during
  decoding the full-precision keys are quantized once `residual` of them have gathered;
- values: quantized per token in groups of `group_size` channels; the last `residual` values stay full
  precision and each older one is quantized as a new token pushes it out of the window.

`update()` returns every key and value the layer holds, the quantized ones dequantized on read, so the
model attends in its own dtype over the dequantized cache (the reference fuses that into its kernels;
the values seen are the same). Nothing dequantized is kept between reads: the stored bytes stay the
quantized ones. Each read writes the codes' values straight into one new buffer per tensor (keys are
stored token-major, quantized along axis -2, so no transpose), beside the copied window. In a batch of
members (`update_into`) the reads go into the batch's buffer for the layer (batched.MemberBuffer), which the batch
keeps as its working memory: only the groups quantized since the member's last step are dequantized, and the
window copied after them (docs/batched-decoding.md: the trade-off). The new tokens are attended in full precision before they are
quantized, as in the reference. `stored_bytes()` counts what the tensors hold: packed codes, scales,
zero points and the full-precision window.

With ThinK (`think+kivi`, `channels` given) the keys are thinned to their kept channels before they are
quantized and widened back with zeros on read; the full-precision window keeps every channel, as in the
ThinK reference's KIVI variant (ThinK_kivi/models/llama_kivi_think.py lines 184-186 and 258).
"""

from __future__ import annotations

import copy

import torch

from .compact_layer import CompactLayer
from .quantization import QuantizedGroups, concatenated, quantize_groups, quantized_bytes
from .thin_keys import INDEX_BYTES, thinned, widened


class KIVILayer(CompactLayer):
    """`keys`/`values` hold the full-precision window; the quantized parts live beside them."""

    def __init__(self, bits: int, group_size: int, residual: int, channels: torch.Tensor | None = None):
        super().__init__()
        self.bits, self.group_size, self.residual = bits, group_size, residual
        self.channels = channels  # ThinK's kept key channels [batch, heads, kept], or None: every channel
        self.quantized_keys: QuantizedGroups | None = None  # [batch, heads, n, head_dim]: groups along tokens
        self.quantized_values: QuantizedGroups | None = None  # [batch, heads, n, head_dim]: groups along channels

    @classmethod
    def holding(cls, keys: torch.Tensor, values: torch.Tensor, bits: int, group_size: int, residual: int,
                channels: torch.Tensor | None = None) -> KIVILayer:
        """A layer storing these prompt keys/values ([batch, heads, T, head_dim]) the KIVI way."""
        layer = cls(bits, group_size, residual, channels)
        layer._append(keys, values)
        layer._flush()
        return layer

    def _append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        if not self.is_initialized:
            self.lazy_initialization(keys, values)
            self.keys = keys.new_empty(*keys.shape[:2], 0, keys.shape[-1])
            self.values = values.new_empty(*values.shape[:2], 0, values.shape[-1])
        self.keys = torch.cat([self.keys, keys], dim=-2)
        self.values = torch.cat([self.values, values], dim=-2)

    def _flush(self) -> None:
        """Move what left the full-precision window into the quantized store."""
        n_keys = self.keys.shape[-2] // self.residual * self.residual
        if n_keys:
            block = self.keys[..., :n_keys, :]
            if self.channels is not None:
                block = thinned(block, self.channels)
            block = quantize_groups(block, self.bits, self.group_size, axis=-2)
            self.quantized_keys = concatenated(self.quantized_keys, block, dim=-2)
            self.keys = self.keys[..., n_keys:, :].contiguous()
        n_values = max(self.values.shape[-2] - self.residual, 0)
        if n_values:
            block = quantize_groups(self.values[..., :n_values, :], self.bits, self.group_size)
            self.quantized_values = concatenated(self.quantized_values, block, dim=-2)
            self.values = self.values[..., n_values:, :].contiguous()

    def dequantized(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every key and value held, quantized ones dequantized, [batch, heads, tokens, head_dim]."""
        keys = self._read(self.quantized_keys, self.keys, thin=self.channels is not None)
        return keys, self._read(self.quantized_values, self.values, thin=False)

    def _read(self, store: QuantizedGroups | None, window: torch.Tensor, thin: bool,
              out: torch.Tensor | None = None, written: int = 0) -> torch.Tensor:
        """The store dequantized, then the window: one new [batch, heads, n + window, head_dim] tensor, or
        written into `out` (a view of that shape), whose first `written` tokens already hold the store's
        (a batch's working buffer, update_into): only the store's tokens after them are dequantized."""
        if store is None:
            return window if out is None else out.copy_(window)
        n = store.shape[-2]  # tokens
        held = window.new_empty(*window.shape[:2], n + window.shape[-2], window.shape[-1]) if out is None else out
        if written < n:
            part = store if written == 0 else store.tokens(written, n)
            if thin:  # think+kivi: the kept channels come back, the pruned ones read as zeros
                widened(part.dequantize(), self.channels, window.shape[-1], out=held[..., written:n, :])
            else:
                part.dequantize(out=held[..., written:n, :])
        held[..., n:, :] = window
        return held

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self._append(key_states, value_states)
        keys, values = self.dequantized()
        self._flush()
        return keys, values

    def update_into(self, key_states, value_states, keys_out, values_out,
                    written: tuple[int, int] = (0, 0)) -> tuple[int, tuple[int, int]]:
        """update(), read straight into a batch's buffers (batched.MemberLayers), whose first written[0] keys and
        written[1] values already hold this layer's quantized ones from an earlier call: only the groups
        quantized since are dequantized, and the full-precision window is copied after them. Returns the tokens
        held and how many keys and values of the buffers now hold quantized ones (the store read before this
        step's _flush: the window's tokens it quantizes are dequantized into their slots on the next call)."""
        self._append(key_states, value_states)
        n = self.get_seq_length()
        stores = tuple(0 if q is None else q.shape[-2] for q in (self.quantized_keys, self.quantized_values))
        self._read(self.quantized_keys, self.keys, self.channels is not None, out=keys_out[..., :n, :],
                   written=written[0])
        self._read(self.quantized_values, self.values, False, out=values_out[..., :n, :], written=written[1])
        self._flush()
        return n, stores

    def fork(self) -> KIVILayer:
        """A shallow copy: update() and _flush() rebind the tensors and stores, never write into them, so the
        copy decodes on without touching this layer's (no copy of the codes)."""
        return copy.copy(self)

    def get_seq_length(self) -> int:
        quantized = 0 if self.quantized_keys is None else self.quantized_keys.length
        return quantized + (self.keys.shape[-2] if self.is_initialized else 0)

    def stored_bytes(self) -> int:
        stores = [q.stored_bytes() for q in (self.quantized_keys, self.quantized_values) if q is not None]
        tensors = [t for t in (self.keys, self.values, self.channels) if t is not None]
        return sum(stores) + sum(t.numel() * t.element_size() for t in tensors)


def kivi_bytes(tokens: int, heads: int, head_dim: int, element_size: int, bits: int, group_size: int,
               residual: int, kept_channels: int | None = None) -> int:
    """Analytic bytes KIVILayer.holding() stores for `tokens` prompt tokens of one layer (batch 1);
    kept_channels: the key channels ThinK keeps (their indices count too), None for every channel."""
    quantized_keys = tokens // residual * residual
    quantized_values = max(tokens - residual, 0)
    full = (tokens - quantized_keys) + (tokens - quantized_values)
    key_channels = head_dim if kept_channels is None else kept_channels
    indices = 0 if kept_channels is None else kept_channels * INDEX_BYTES
    quantized = quantized_bytes(quantized_keys * key_channels, bits, group_size, element_size) + \
        quantized_bytes(quantized_values * head_dim, bits, group_size, element_size)
    return heads * (quantized + full * head_dim * element_size + indices)
