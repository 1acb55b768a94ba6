"""Put a cache back to an earlier length, bitwise, without copying it.

Appending to a transformers cache layer concatenates into new tensors and never writes into the old
ones, so keeping a view of each layer's first n positions restores the exact earlier state. A ragged
(head-adaptive) layer keeps its per-head prompt tensors apart and appends to a dense tail, which is what
gets cut back there.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers.cache_utils import DynamicCache


@dataclass(frozen=True)
class CacheSnapshot:
    lengths: tuple[int, ...]  # per layer, the positions its (dense) keys held

    @classmethod
    def take(cls, cache: DynamicCache) -> CacheSnapshot:
        return cls(tuple(int(layer.keys.shape[-2]) for layer in cache.layers))

    def restore(self, cache: DynamicCache) -> None:
        """Drop what was appended to each layer since the snapshot."""
        for layer, length in zip(cache.layers, self.lengths):
            if layer.keys.shape[-2] > length:
                layer.keys = layer.keys[..., :length, :]
                layer.values = layer.values[..., :length, :]
