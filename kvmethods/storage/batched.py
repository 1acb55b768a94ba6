"""Several sequences' compressed caches as one padded batch, so a group's members decode in one forward a step.

After a shared prefill every member of a sample holds its own cache: the same prompt, compressed its own way,
so the layers differ in length between members (snapkv vs pyramidkv), between layers (pyramidkv) and between
heads (adakv's ragged layers, `ragged.RaggedLayer`). `BatchedLayer` is a transformers cache layer (a
`DynamicLayer` subclass plugged into `DynamicCache.layers`, the public Cache API) holding one layer of B
members: each member's kept tokens per KV head, left-aligned and zero-padded to the longest of the batch,
in one [B, kv_heads, P + room, dim] buffer, and the tokens added afterwards (teacher-forced targets, decoded
tokens) written after position P in place, so a decoding step copies nothing but its own token.

`attention_mask()` gives the boolean mask sdpa takes, [B, 1 or query heads, q, P + tail + q]: member b's head h
sees its own kept tokens (the first lengths[b, h] slots), none of the padding, and the tokens after P
causally. Keys carry their RoPE rotation from the prefill, and attention does not depend on where a key
sits, so left-aligned kept tokens give each member exactly its own attention, up to float rounding of a
different shape (tests/kvmethods/test_batched_decode.py bounds it). A member that stops leaves the batch
(`keep_rows`); the tail can be dropped back to the prompt (`drop_tail`) so the teacher-forced pass and the
greedy decoding share one padded copy. Only plain dense layers and ragged layers can be batched
(`can_batch`); any other storage (quantized, channel-pruned, a third party's) decodes alone.
"""

from __future__ import annotations

import torch

from ..adapters.transformers_compat import DynamicLayer, mask_query_length
from .ragged import RaggedLayer


def can_batch(layer) -> bool:
    """Whether a member's cache layer can join a batch: a plain dense layer or a ragged one, of one sequence."""
    return type(layer) in (DynamicLayer, RaggedLayer) and layer.keys is not None and layer.keys.shape[0] == 1


def _head_sequences(layer) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per KV head, the tokens a batch-1 layer holds ([n_h, dim] keys and values)."""
    if isinstance(layer, RaggedLayer):
        return ([torch.cat([own, tail]) for own, tail in zip(layer.head_keys, layer.keys[0])],
                [torch.cat([own, tail]) for own, tail in zip(layer.head_values, layer.values[0])])
    return list(layer.keys[0]), list(layer.values[0])


class BatchedLayer(DynamicLayer):
    """One layer of B members' caches: padded kept tokens [B, heads, P, dim] + in-place room for new tokens."""

    def __init__(self, layers: list, room: int):
        """layers: each member's layer (can_batch); room: new tokens the buffer holds before it must grow."""
        super().__init__()
        keys = [_head_sequences(layer) for layer in layers]
        first = layers[0].keys
        heads, dim = first.shape[1], first.shape[-1]
        lengths = torch.tensor([[int(k.shape[0]) for k in member[0]] for member in keys], dtype=torch.long)
        self.prompt = int(lengths.max())
        self.lazy_initialization(first, first)
        self._keys = first.new_zeros(len(layers), heads, self.prompt + room, dim)
        self._values = first.new_zeros(len(layers), heads, self.prompt + room, dim)
        for b, (member_keys, member_values) in enumerate(keys):
            for h, (k, v) in enumerate(zip(member_keys, member_values)):
                self._keys[b, h, : k.shape[0]] = k
                self._values[b, h, : v.shape[0]] = v
        self.lengths = lengths.to(first.device)  # [B, heads] kept tokens of each member's head
        self.uniform_heads = bool((self.lengths == self.lengths[:, :1]).all())  # one mask row serves all heads
        self.tail = 0
        self._set_views()

    def _set_views(self) -> None:
        self.keys = self._keys[:, :, : self.prompt + self.tail]
        self.values = self._values[:, :, : self.prompt + self.tail]

    @property
    def batch_size(self) -> int:
        return int(self._keys.shape[0])

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        new = key_states.shape[-2]
        end = self.prompt + self.tail + new
        if end > self._keys.shape[-2]:  # out of room: grow (a teacher-forced pass longer than the decoding)
            grow = end - self._keys.shape[-2]
            pad = self._keys.new_zeros(*self._keys.shape[:2], grow, self._keys.shape[-1])
            self._keys, self._values = torch.cat([self._keys, pad], dim=-2), torch.cat([self._values, pad], dim=-2)
        self._keys[:, :, end - new: end] = key_states
        self._values[:, :, end - new: end] = value_states
        self.tail += new
        self._set_views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.prompt + self.tail

    def get_mask_sizes(self, query, *args, **kwargs) -> tuple[int, int]:
        return self.get_seq_length() + mask_query_length(query), 0

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a batched cache layer is cut back with drop_tail()")

    def drop_tail(self) -> None:
        """Back to the members' prompt caches: the tokens added since are forgotten (their slots reused)."""
        self.tail = 0
        self._set_views()

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Only the members at `rows` stay in the batch (the others stopped)."""
        self._keys, self._values = self._keys[rows], self._values[rows]
        self.lengths = self.lengths[rows.to(self.lengths.device)]
        self.uniform_heads = bool((self.lengths == self.lengths[:, :1]).all())
        self._set_views()

    def attention_mask(self, query_length: int, num_query_heads: int) -> torch.Tensor:
        """[B, 1 or num_query_heads, query_length, P + tail + query_length] bool (True: attend) for the next
        query_length tokens (asked before update() stores them): each member's head sees its own kept tokens,
        then the tail and the new tokens causally."""
        device = self._keys.device
        lengths = self.lengths[:, :1] if self.uniform_heads else self.lengths  # [B, H']
        prompt = torch.arange(self.prompt, device=device) < lengths.unsqueeze(-1)  # [B, H', P]
        rows = torch.arange(query_length, device=device).unsqueeze(-1)
        causal = torch.arange(self.tail + query_length, device=device) <= rows + self.tail  # [q, tail + q]
        batch, heads = prompt.shape[:2]
        visible = torch.cat([prompt.unsqueeze(2).expand(-1, -1, query_length, -1),
                             causal.expand(batch, heads, -1, -1)], dim=-1)
        if heads > 1:  # query heads share KV heads, as transformers' repeat_kv
            visible = visible.repeat_interleave(num_query_heads // heads, dim=1)
        return visible
