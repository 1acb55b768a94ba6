"""Put a cache back to an earlier state, bitwise; without copying it where appending never rewrites.

Appending to a transformers cache layer concatenates into new tensors and never writes into the old
ones, so keeping a view of each layer's first n positions restores the exact earlier state. A ragged
(head-adaptive) layer keeps its per-head prompt tensors apart and appends to a dense tail, which is what
gets cut back there. Other layers (a quantized store: KIVI moves full-precision tokens into its codes once
`residual` of them gather, transformers' quantized layers re-quantize) change more than their tail, so the
snapshot keeps a copy of those and puts a fresh copy back.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from ...storage.ragged import RaggedLayer
from ...adapters.transformers_compat import DynamicCache, DynamicLayer

APPEND_ONLY = (DynamicLayer, RaggedLayer)  # exact types: subclasses (KIVI's layer) may rewrite on append


@dataclass(frozen=True)
class CacheSnapshot:
    lengths: tuple[int | None, ...]  # per append-only layer, the positions its (dense) keys held; else None
    copies: tuple[object | None, ...]  # per other layer, a copy of it

    @classmethod
    def take(cls, cache: DynamicCache) -> CacheSnapshot:
        append_only = [type(layer) in APPEND_ONLY for layer in cache.layers]
        return cls(tuple(int(layer.keys.shape[-2]) if plain else None for layer, plain in zip(cache.layers, append_only)),
                   tuple(None if plain else copy.deepcopy(layer) for layer, plain in zip(cache.layers, append_only)))

    def restore(self, cache: DynamicCache) -> None:
        """Drop what was appended to each layer since the snapshot."""
        for index, (layer, length, saved) in enumerate(zip(cache.layers, self.lengths, self.copies)):
            if saved is not None:
                cache.layers[index] = copy.deepcopy(saved)
            elif layer.keys.shape[-2] > length:
                layer.keys = layer.keys[..., :length, :]
                layer.values = layer.values[..., :length, :]
