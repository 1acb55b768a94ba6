"""Ragged per-head cache storage for head-adaptive methods (AdaKV): memory follows the kept tokens.

When the KV heads of a layer keep different numbers of prompt tokens, a rectangular [batch, heads, n, dim]
tensor would have to be as long as the longest head, and kvpress only masks the evicted positions, saving
nothing. `RaggedLayer` is a transformers cache layer (a `DynamicLayer` subclass, plugged into
`DynamicCache.layers`) that stores each KV head's kept prompt tokens in its own tensor, so the bytes held
are the sum over heads of what they keep. Tokens added after the prompt (the question of the
query-agnostic protocol, decoded tokens) are the same for every head and go to a dense tail.

Attention never changes: `update()` hands the model a padded view (each head's prompt tokens, zero-padded
to the longest head, then the tail), and `attention_mask()` gives the per-head additive mask that hides the
padding; `prefill_compression.per_layer_causal_masks` installs it. That is exactly attention per head over its own kept
tokens (the padded columns get weight 0). This is the portable path (`KERNEL` in the records); on CUDA with
flash-attn installed, `ragged_attention.py` attends with its variable-length kernel instead and the layer
hands out only the tail (`packed_reads`).

Decoding does not re-pad every step (issue 36: 1.7 to 2.1 tok/s on an H200 without flash-attn). The first
single-token forward lays the padded view out once in a working buffer (`_DecodeView`: keys, values and the
decode step's per-query-head mask, with room for more tokens), and every later forward writes its new tokens
into it in place and reads a view of its first rows; the buffer grows by doubling the tail's room. Its
contents equal the re-padded view's, so attention is the same bit for bit. The working buffer is not the
storage: `stored_bytes()` (the records' physical bytes, measured before decoding) counts the per-head
tensors and the tail, as before; while decoding, the buffer adds about heads x the longest head to the
memory in use (what the per-step view allocated anew each step), and peak memory in the records includes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..adapters.mixed_cache import is_state_layer, state_bytes
from ..adapters.transformers_compat import DynamicLayer, mask_query_length

# What attends over the ragged cache; recorded with each sample of a head-adaptive method.
KERNEL = "padded-view+per-head-mask"


@dataclass
class _DecodeView:
    """The padded view laid out once for decoding: keys/values [1, heads, room, dim], filled up to the view's
    length, and the decode step's masks per (query heads, dtype), [1, query heads, 1, room]."""

    keys: torch.Tensor
    values: torch.Tensor
    masks: dict = field(default_factory=dict)


class RaggedLayer(DynamicLayer):
    """One layer's cache: per KV head its own prompt tokens ([n_h, dim] each), plus a shared dense tail."""

    packed_reads = False  # set while ragged_attention's varlen kernel reads the heads' tensors itself

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, kept: torch.Tensor):
        """keys/values [1, heads, T, dim]; kept: bool [1, heads, T], at least one position per head."""
        super().__init__()
        if keys.shape[0] != 1:
            raise ValueError("RaggedLayer stores one sequence (batch size 1)")
        self.lazy_initialization(keys, values)
        self.head_keys = [keys[0, h, kept[0, h]].contiguous() for h in range(keys.shape[1])]
        self.head_values = [values[0, h, kept[0, h]].contiguous() for h in range(keys.shape[1])]
        self.keys = keys.new_empty(1, keys.shape[1], 0, keys.shape[-1])  # the dense tail
        self.values = values.new_empty(1, values.shape[1], 0, values.shape[-1])

    @property
    def kept_per_head(self) -> list[int]:
        """Prompt tokens each KV head keeps (the tail not included)."""
        return [int(k.shape[0]) for k in self.head_keys]

    @property
    def padded_length(self) -> int:
        return max(self.kept_per_head)

    def tokens_per_head(self) -> list[int]:
        """Tokens each KV head holds: its own prompt tokens plus the shared tail."""
        return [n + self.keys.shape[-2] for n in self.kept_per_head]

    def stored_bytes(self) -> int:
        tensors = [*self.head_keys, *self.head_values, self.keys, self.values]
        return sum(t.numel() * t.element_size() for t in tensors)

    def _padded(self, per_head: list[torch.Tensor], tail: torch.Tensor, length: int | None = None) -> torch.Tensor:
        """[1, heads, length (default: the view's), dim]: each head's prompt tokens zero-padded, then the tail."""
        heads, dim = len(per_head), tail.shape[-1]
        out = tail.new_zeros(1, heads, length or self.padded_length + tail.shape[-2], dim)
        for h, tensor in enumerate(per_head):
            out[0, h, : tensor.shape[0]] = tensor
        out[:, :, self.padded_length : self.padded_length + tail.shape[-2]] = tail
        return out

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        held = self.keys.shape[-2]  # the tail before this forward's tokens
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        if self.packed_reads:
            return self.keys, self.values
        if self._view is None and key_states.shape[-2] > 1:  # a multi-token forward before decoding: once
            return self._padded(self.head_keys, self.keys), self._padded(self.head_values, self.values)
        view = self._decode_view(self.padded_length + self.keys.shape[-2])
        start = self.padded_length + held
        view.keys[:, :, start : start + key_states.shape[-2]] = key_states
        view.values[:, :, start : start + key_states.shape[-2]] = value_states
        end = self.padded_length + self.keys.shape[-2]
        return view.keys[:, :, :end], view.values[:, :, :end]

    _view: _DecodeView | None = None  # the decoding working buffer, made by the first single-token forward

    def _decode_view(self, needed: int) -> _DecodeView:
        """The working buffer, with room for `needed` positions (made or grown here, from the storage)."""
        view = self._view
        if view is None or view.keys.shape[-2] < needed:
            room = self.padded_length + max(64, 2 * (needed - self.padded_length))
            self._view = view = _DecodeView(self._padded(self.head_keys, self.keys, room),
                                            self._padded(self.head_values, self.values, room))
        return view

    def get_seq_length(self) -> int:
        """Length of the padded view the attention sees (what the model's own mask is sized for)."""
        return self.padded_length + self.keys.shape[-2]

    def get_mask_sizes(self, query, *args, **kwargs) -> tuple[int, int]:
        return self.get_seq_length() + mask_query_length(query), 0

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a ragged cache layer cannot be cropped")

    def attention_mask(self, query_length: int, num_query_heads: int, dtype: torch.dtype) -> torch.Tensor:
        """[1, num_query_heads, query_length, padded view length] additive mask for the next tokens: each
        head sees its own kept prompt tokens, and the tail causally. A decoding step (one query, which sees
        the whole tail) reads a view of the working buffer's mask, made once."""
        end = self.padded_length + self.keys.shape[-2] + query_length
        if query_length == 1:
            view = self._decode_view(end)
            mask = view.masks.get((num_query_heads, dtype))
            if mask is None or mask.shape[-1] < view.keys.shape[-2]:
                mask = view.masks[num_query_heads, dtype] = self._prompt_mask(view.keys.shape[-2], num_query_heads,
                                                                              dtype)
            return mask[..., :end]
        kept = torch.tensor(self.kept_per_head, device=self.keys.device)
        mask = visibility_mask(kept, self.padded_length, self.keys.shape[-2], query_length, dtype)
        return mask.repeat_interleave(num_query_heads // len(self.head_keys), dim=1)  # query heads share KV heads

    def _prompt_mask(self, room: int, num_query_heads: int, dtype: torch.dtype) -> torch.Tensor:
        """[1, num_query_heads, 1, room]: each head's padding hidden, every other position visible."""
        kept = torch.tensor(self.kept_per_head, device=self.keys.device)
        hidden = (torch.arange(room, device=kept.device) >= kept.unsqueeze(-1)) & (
            torch.arange(room, device=kept.device) < self.padded_length)
        mask = torch.zeros(hidden.shape, dtype=dtype, device=kept.device).masked_fill_(hidden, torch.finfo(dtype).min)
        return mask.repeat_interleave(num_query_heads // len(self.head_keys), dim=0)[None, :, None]


def visibility_mask(kept: torch.Tensor, padded: int, tail: int, query_length: int, dtype: torch.dtype) -> torch.Tensor:
    """[1, heads, query_length, padded + tail + query_length] additive mask (0 visible, dtype's min hidden):
    head h sees the first kept[h] of `padded` prompt slots, then the tail and the new tokens causally."""
    device = kept.device
    prompt = torch.arange(padded, device=device) < kept.unsqueeze(-1)  # [heads, padded]
    prompt = prompt.unsqueeze(1).expand(-1, query_length, -1)
    rows = torch.arange(query_length, device=device).unsqueeze(-1)
    causal = torch.arange(tail + query_length, device=device) <= rows + tail  # [q, tail + q]
    visible = torch.cat([prompt, causal.expand(len(kept), -1, -1)], dim=-1)
    mask = torch.zeros(visible.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min).unsqueeze(0)


def cache_bytes(cache) -> tuple[int, int]:
    """(logical, physical) bytes of a cache: the kept tokens' keys and values in the model's dtype, and what
    the tensors hold (packed codes, scales and zero points included for a quantized layer)."""
    logical = physical = 0
    for layer in cache.layers:
        if is_state_layer(layer):  # linear attention's state: held in full, whatever the method
            logical += state_bytes(layer)
            physical += state_bytes(layer)
        elif hasattr(layer, "stored_bytes"):  # ragged or quantized (kivi_layer.KIVILayer) storage
            row = 2 * layer.keys.shape[-1] * layer.keys.element_size()  # one token of one head, K and V
            logical += row * sum(layer.tokens_per_head())
            physical += layer.stored_bytes()
        else:
            held = sum(t.numel() * t.element_size() for t in (layer.keys, layer.values))
            logical += held
            physical += held
    return logical, physical


def kept_tokens_per_head(cache) -> list[list[int]]:
    """Per layer, the tokens each KV head holds (none for a linear-attention layer, which holds no token)."""
    out = []
    for layer in cache.layers:
        if is_state_layer(layer):
            out.append([])
        elif hasattr(layer, "tokens_per_head"):  # ragged or quantized storage
            out.append(layer.tokens_per_head())
        else:
            out.append([layer.keys.shape[-2]] * layer.keys.shape[1])
    return out
