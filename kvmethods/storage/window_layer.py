"""A sliding-window layer's cache once the rest of the cache is compressed: its window, by positions.

A sliding-window layer (gemma2/3, gpt-oss, cohere2, mistral with a window) attends over its last `window`
tokens only, so by default no method compresses it: it is kept as its window (core/layout.py, sliding
"keep"). The model's own masks find a token's position from its cache index, which holds while no layer is
compressed; once others are, every forward gets per-layer masks (prefill_compression.per_layer_causal_masks), and this
layer's mask comes from here: the layer knows the position of every token it holds, per KV head, so a new token
at position p sees the held and new tokens at positions p - window + 1 .. p. After each update it drops the
tokens no later query can see (what transformers' own sliding-window cache does: `window - 1` tokens stay), so
decoding holds the window, not the sequence, and the memory figures count what the layer really stores:
kv_bytes_after includes it, and `kv_bytes_window` (a sample field, generation.record_fields) says how much of it
the window layers hold.

With sliding "compress" (`Method.sliding_layers`) the method also compresses the window to its budget
(prefill_compression.compress_window): it scores the window's tokens like a short prompt and each KV head keeps its own
positions, so the positions are per head ([batch, kv_heads, n]); masks then differ per head (repeated over the
query heads of a group, as transformers' repeat_kv does) and a kept token leaves once it is out of every head's
window. A window already within the budget stays the window.
"""

from __future__ import annotations

from collections import deque

import torch

from ..adapters.transformers_compat import DynamicLayer


class WindowLayer(DynamicLayer):
    """A DynamicLayer holding, per KV head, the tokens at `positions` [batch, kv_heads, n] (ascending), the next
    token being at `next_position`."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, window: int, first_position: int = 0,
                 positions: torch.Tensor | None = None) -> None:
        super().__init__()
        self.lazy_initialization(keys, values)
        self.keys, self.values = keys, values
        self.window = window
        if positions is None:
            positions = torch.arange(first_position, first_position + keys.shape[-2], device=keys.device)
            positions = positions.expand(*keys.shape[:2], -1)
        self.positions = positions
        self._set_columns()
        self.next_position = self.column_newest[-1] + 1 if self.column_newest else first_position
        self._trim(copy=True)  # a trimmed copy: the full layer's tensors are freed (or stay the reference's own)

    def _set_columns(self) -> None:
        """On the host, per held column, its newest position over the heads (what trimming reads: no device sync
        per decoding step), and whether every head holds the same positions (one mask row serves them all)."""
        self.column_newest = deque(self.positions.amax(dim=(0, 1)).tolist())
        self.uniform_heads = bool((self.positions == self.positions[:, :1]).all())

    def _trim(self, copy: bool = False) -> None:
        """Drop the leading tokens no later query sees (out of every head's window)."""
        oldest_seen = self.next_position - (self.window - 1)
        excess = 0  # positions ascend per head, so the columns stale in every head lead
        while self.column_newest and self.column_newest[0] < oldest_seen:
            self.column_newest.popleft()
            excess += 1
        if excess > 0:
            self.keys, self.values = self.keys[..., excess:, :], self.values[..., excess:, :]
            self.positions = self.positions[..., excess:]
            if copy:
                self.keys, self.values = self.keys.clone(), self.values.clone()

    def select(self, indices: torch.Tensor) -> None:
        """Keep the tokens at `indices` [batch, kv_heads, n] (ascending, into what the layer holds), per head."""
        gather = indices.unsqueeze(-1)
        self.keys = self.keys.gather(2, gather.expand(-1, -1, -1, self.keys.shape[-1]))
        self.values = self.values.gather(2, gather.expand(-1, -1, -1, self.values.shape[-1]))
        self.positions = self.positions.gather(2, indices)
        self._set_columns()

    def held_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.keys, self.values))

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        new = key_states.shape[-2]
        keys, values = super().update(key_states, value_states, *args, **kwargs)
        added = torch.arange(self.next_position, self.next_position + new, device=self.positions.device)
        self.positions = torch.cat([self.positions, added.expand(*self.positions.shape[:2], -1)], dim=-1)
        self.column_newest.extend(range(self.next_position, self.next_position + new))
        self.next_position += new
        self._trim()  # the returned tensors (what this forward attends to) keep every token
        return keys, values

    def attention_mask(self, new_tokens: int, dtype: torch.dtype, device, num_query_heads: int = 1) -> torch.Tensor:
        """[batch, 1 or num_query_heads, new_tokens, length + new_tokens] additive mask for the next forward
        (before its update): per head, the held and new tokens within the window of each new token."""
        positions = self.positions[:, :1] if self.uniform_heads else self.positions
        added = torch.arange(self.next_position, self.next_position + new_tokens, device=device)
        keys = torch.cat([positions.to(device), added.expand(*positions.shape[:2], -1)], dim=-1)  # [B, H', L + q]
        distance = added.view(1, 1, -1, 1) - keys.unsqueeze(2)  # [B, H', q, L + q]
        visible = (distance >= 0) & (distance < self.window)
        if visible.shape[1] > 1:  # query heads share KV heads, as transformers' repeat_kv
            visible = visible.repeat_interleave(num_query_heads // visible.shape[1], dim=1)
        mask = torch.zeros(visible.shape, dtype=dtype, device=device)
        return mask.masked_fill_(~visible, torch.finfo(dtype).min)


def keep_window(cache, layer_idx: int, window: int) -> torch.Tensor:
    """Turn layer `layer_idx` of `cache` (a full, uncompressed sliding layer) into its WindowLayer; returns the
    kept positions [batch, kv_heads, n] (the selection records show)."""
    layer = cache.layers[layer_idx]
    if not isinstance(layer, WindowLayer):
        layer = cache.layers[layer_idx] = WindowLayer(layer.keys, layer.values, window, 0)
    return layer.positions
