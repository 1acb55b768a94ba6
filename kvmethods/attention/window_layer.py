"""A sliding-window layer's cache once the rest of the cache is compressed: its window, by positions.

A sliding-window layer (gemma2/3, gpt-oss, cohere2, mistral with a window) attends over its last `window`
tokens only, so by default no method compresses it: it is kept as its window (families/layout.py). The model's
own masks find a token's position from its cache index, which holds while no layer is compressed; once others
are, every forward gets per-layer masks (hooks.per_layer_causal_masks), and this layer's mask comes from here:
the layer knows the position of its first cached token, so a new token at position p sees the cached and new
tokens at positions p - window + 1 .. p. After each update it keeps only the `window - 1` latest tokens (what
transformers' own sliding-window cache keeps), so decoding holds the window, not the sequence, and the
memory figures count what the layer really stores: kv_bytes_after includes it, and `kv_bytes_window` (a
sample field, generation.record_fields) says how much of it the window layers hold.
"""

from __future__ import annotations

import torch

from ..adapters.transformers_compat import DynamicLayer


class WindowLayer(DynamicLayer):
    """A DynamicLayer holding the tokens at positions first_position .. first_position + length - 1."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, window: int, first_position: int) -> None:
        super().__init__()
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values
        self.window = window
        self.first_position = first_position
        self._trim(copy=True)  # a copy: the full layer's tensors are freed (or stay the reference's own)

    def _trim(self, copy: bool = False) -> None:
        excess = self.keys.shape[-2] - (self.window - 1)
        if excess > 0:
            self.keys, self.values = self.keys[..., excess:, :], self.values[..., excess:, :]
            if copy:
                self.keys, self.values = self.keys.clone(), self.values.clone()
            self.first_position += excess

    def held_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        self._trim()  # the returned tensors (what this forward attends to) keep every token
        return keys, values

    def attention_mask(self, new_tokens: int, dtype: torch.dtype, device) -> torch.Tensor:
        """[1, 1, new_tokens, length + new_tokens] additive mask for the next forward (before its update)."""
        length = self.keys.shape[-2]
        keys = self.first_position + torch.arange(length + new_tokens, device=device)
        queries = self.first_position + length + torch.arange(new_tokens, device=device)
        distance = queries.unsqueeze(-1) - keys.unsqueeze(0)
        visible = (distance >= 0) & (distance < self.window)
        mask = torch.zeros(visible.shape, dtype=dtype, device=device)
        return mask.masked_fill_(~visible, torch.finfo(dtype).min).view(1, 1, new_tokens, -1)


def keep_window(cache, layer_idx: int, window: int) -> torch.Tensor:
    """Turn layer `layer_idx` of `cache` (a full, uncompressed sliding layer) into its WindowLayer; returns the
    kept positions [batch, kv_heads, n] (the selection records show)."""
    layer = cache.layers[layer_idx]
    if not isinstance(layer, WindowLayer):
        layer = cache.layers[layer_idx] = WindowLayer(layer.keys, layer.values, window, 0)
    first, keys = layer.first_position, layer.keys
    return torch.arange(first, first + keys.shape[-2], device=keys.device).expand(keys.shape[0], keys.shape[1], -1)
