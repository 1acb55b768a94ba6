"""The cache a model needs, and the layers of it that hold no per-token keys and values (linear attention).

A model with linear-attention layers between softmax ones (qwen3_next's gated DeltaNet) keeps, for each linear
layer, a fixed-size state (a convolution window and a recurrent matrix) instead of per-token keys and values,
in the model's own mixed cache. transformers 5.24 builds it as a `DynamicCache(config=...)` whose linear layers
are `LinearAttentionLayer` entries; 5.2 (kvpress' pin) has a separate `Qwen3NextDynamicCache` class without
cache layers. `new_cache(model)` gives a `DynamicCache` either way: in 5.2 `LinearStateCache`, a DynamicCache
whose linear layers are `LinearStateLayer` entries holding the state the way 5.24's do (`conv_states` and
`recurrent_states` dicts), with the attributes 5.2's linear attention reads (`cache.conv_states[i]`,
`cache.recurrent_states[i]`, `has_previous_state`) mapped onto them. So kvmethods walks one kind of cache in both
versions: `is_state_layer(layer)` says which layers to leave alone (no tokens to evict, gather or mask) and
`state_bytes(layer)` is what such a layer holds, which the memory figures count. A batch of members decodes with
their states stacked along the batch axis (`stacked_state`), in a cache of the model's kind (`cache_of_layers`).
"""

from __future__ import annotations

import copy

import torch

from .decoder_parts import attention_modules
from .transformers_compat import DynamicCache, DynamicLayer


def is_state_layer(layer) -> bool:
    """Whether a cache layer holds a fixed-size state (linear attention) rather than per-token keys/values."""
    return isinstance(getattr(layer, "recurrent_states", None), dict)


def state_bytes(layer) -> int:
    """Bytes of a state layer's convolution and recurrent states (0 for any other layer)."""
    if not is_state_layer(layer):
        return 0
    tensors = [*layer.conv_states.values(), *layer.recurrent_states.values()]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def token_layers(cache) -> list:
    """The cache's layers that hold per-token keys and values."""
    return [layer for layer in cache.layers if not is_state_layer(layer)]


def stacked_state(layers: list):
    """One state layer holding B members' states (each a batch-1 state layer), stacked along the batch axis: what a
    batch of members decodes with (runtime/batched_generation.py); each row evolves on its own."""
    batch = copy.deepcopy(layers[0])
    for name in ("conv_states", "recurrent_states"):
        states = getattr(batch, name)
        for index in states:
            if states[index] is not None:
                states[index] = torch.cat([getattr(layer, name)[index] for layer in layers])
    return batch


def keep_state_rows(layer, rows: torch.Tensor) -> None:
    """Keep only these batch rows of a stacked state layer (members leaving a batch)."""
    layer.reorder_cache(rows)


def cache_of_layers(like, layers: list) -> DynamicCache:
    """A cache of `like`'s kind (a plain DynamicCache, or a model's mixed cache) holding `layers`."""
    cache = copy.copy(like) if any(is_state_layer(layer) for layer in like.layers) else DynamicCache()
    cache.layers = layers
    return cache


def has_linear_layers(model) -> bool:
    return any(module is None for module in attention_modules(model))


def new_cache(model) -> DynamicCache:
    """An empty cache for `model`'s forward: a plain DynamicCache, or the model's mixed cache when some of its
    layers are linear attention."""
    if not has_linear_layers(model):
        return DynamicCache()
    import transformers.cache_utils as cache_utils  # lazy: only for models with linear layers

    if hasattr(cache_utils, "LinearAttentionLayer"):  # 5.24: the config says which layer is which
        return DynamicCache(config=model.config)
    return LinearStateCache(model.config)


def resumes_stepwise(cache) -> bool:
    """Whether a forward of several tokens over this cache must go one token at a time: 5.2's linear attention
    starts a multi-token forward from an empty state (`initial_state=None`) even when the cache holds one, so a
    question after a compressed context, or teacher forcing, would forget the context in those layers; one token
    at a time it takes the recurrent path, which resumes from the state."""
    return isinstance(cache, LinearStateCache) and cache.has_previous_state


class LinearStateLayer:
    """5.2: one linear-attention layer's state, held as 5.24's LinearAttentionLayer holds it."""

    is_sliding = False
    is_compileable = False

    def __init__(self) -> None:
        self.conv_states: dict[int, torch.Tensor | None] = {0: None}
        self.recurrent_states: dict[int, torch.Tensor | None] = {0: None}

    def get_seq_length(self) -> int:
        return 0

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        for states in (self.conv_states, self.recurrent_states):
            if states[0] is not None:
                states[0] = states[0].index_select(0, beam_idx.to(states[0].device))


class _States:
    """`cache.conv_states[i]` / `cache.recurrent_states[i]` of 5.2's Qwen3NextDynamicCache, read and written in the
    cache's i-th LinearStateLayer."""

    def __init__(self, cache: LinearStateCache, name: str) -> None:
        self.cache, self.name = cache, name

    def __getitem__(self, index: int):
        layer = self.cache.layers[index]
        return getattr(layer, self.name)[0] if is_state_layer(layer) else None

    def __setitem__(self, index: int, value) -> None:
        getattr(self.cache.layers[index], self.name)[0] = value


class LinearStateCache(DynamicCache):
    """5.2: a DynamicCache whose linear-attention layers are LinearStateLayers, answering what the model's
    linear attention asks of Qwen3NextDynamicCache."""

    def __init__(self, config) -> None:
        types = list(config.layer_types)
        super().__init__()
        self.layers = [LinearStateLayer() if kind == "linear_attention" else DynamicLayer() for kind in types]
        self.layer_class_to_replicate = None
        self.last_linear_layer = len(types) - 1 - types[::-1].index("linear_attention")

    @property
    def conv_states(self) -> _States:
        return _States(self, "conv_states")

    @property
    def recurrent_states(self) -> _States:
        return _States(self, "recurrent_states")

    @property
    def has_previous_state(self) -> bool:
        return self.conv_states[self.last_linear_layer] is not None

    def _attention_layer(self, layer_idx: int) -> int:
        if layer_idx < len(self.layers) and not is_state_layer(self.layers[layer_idx]):
            return layer_idx
        return next(i for i, layer in enumerate(self.layers) if not is_state_layer(layer))

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return super().get_seq_length(self._attention_layer(layer_idx))

    def get_mask_sizes(self, cache_position, layer_idx: int):
        return super().get_mask_sizes(cache_position, self._attention_layer(layer_idx))
