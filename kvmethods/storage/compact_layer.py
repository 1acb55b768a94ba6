"""The base of cache layers that store the kept tokens in another form (KIVI codes, ThinK's thin keys).

Such a layer is a transformers `DynamicLayer` (the public Cache API) whose `update()` returns full keys and
values for attention while the layer itself holds less. What they share lives here: the mask sizes follow
the tokens held, the layer cannot be cropped, and it reports its tokens per KV head and the bytes its
tensors hold (`stored_bytes`, read by ragged.cache_bytes for the records). A batch of such layers
(batched.MemberLayers) forks each member's layer and has it write what it returns straight into the batch's
padded buffer (`update_into`).
"""

from __future__ import annotations

import copy

from ..adapters.transformers_compat import DynamicLayer, mask_query_length


class CompactLayer(DynamicLayer):
    """Subclasses implement update(), get_seq_length() and stored_bytes(); `values` has the KV heads on axis 1."""

    def get_mask_sizes(self, query, *args, **kwargs) -> tuple[int, int]:
        return self.get_seq_length() + mask_query_length(query), 0

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(f"a {type(self).__name__} cannot be cropped")

    def tokens_per_head(self) -> list[int]:
        return [self.get_seq_length()] * self.values.shape[1]

    def stored_bytes(self) -> int:
        raise NotImplementedError

    def update_into(self, key_states, value_states, keys_out, values_out,
                    written: tuple[int, int] = (0, 0)) -> tuple[int, tuple[int, int]]:
        """update(), with the keys and values it returns ([batch, heads, n, dim]) written into the first n
        positions of keys_out / values_out (views of a batch's working buffer, room for n at least, kept between
        steps). `written`: how many leading keys and values the buffers already hold from this layer's earlier
        calls, which a subclass need not write again. Returns n and how many leading keys and values stay the same
        from now on (here none: everything is written every time)."""
        keys, values = self.update(key_states, value_states)
        n = keys.shape[-2]
        keys_out[..., :n, :].copy_(keys)
        values_out[..., :n, :].copy_(values)
        return n, (0, 0)

    def fork(self) -> CompactLayer:
        """A copy that decoding can update without changing this layer (a deep copy unless a subclass knows
        better)."""
        return copy.deepcopy(self)
