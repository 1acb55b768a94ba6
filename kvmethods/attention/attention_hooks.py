"""Hooks on every decoder layer's attention module, registered and removed in one place.

kvmethods never replaces an attention forward: whatever acts layer by layer during a forward
(compression at prefill, the shared prefill's selections, compression while decoding, ThinK's
window queries, per-layer causal masks) hooks each layer's attention module through PyTorch's public
hook API and removes the hooks when the forward is done, also when it raised. This module does that registration, unpacks what a hook receives into an
`AttentionCall`, and keeps q_proj's output so that queries need not be projected twice. Where a whole
attention computation must differ (ragged caches, KVzip's repeat forwards), `attention_function` names a
function registered with transformers' public AttentionInterface for the duration of a block.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace

import torch
from torch.utils.hooks import RemovableHandle

from ..core.layout import PROJECTION, LayerLayout
from ..adapters.decoder_parts import attention_modules
from .model_probe import describe
from ..core.layer_inputs import LayerInputs
from .query_capture import capturing_queries
from ..adapters.transformers_compat import attention_implementation


@contextmanager
def attention_function(model, name: str, state: ContextVar, value) -> Iterator[None]:
    """While active, the model's attention runs the AttentionInterface function registered as `name`, which
    reads `value` from `state`; the previous implementation and state are restored also when the forward raised."""
    previous = attention_implementation(model)
    token = state.set(value)
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
        state.reset(token)


@dataclass(frozen=True)
class AttentionCall:
    """What one attention forward received: its module and layer, the layer's input hidden states
    and the RoPE cos/sin of their positions (None where the model passed none); for layers whose queries
    the hooks cannot recompute (layout "captured"), the RoPE'd queries its attention function received."""

    module: torch.nn.Module
    layer_idx: int
    n_layers: int
    hidden: torch.Tensor
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    captured: torch.Tensor | None = None  # [batch, q_heads, n, dim]
    layout: LayerLayout | None = None
    # MLA layers (layout.latent): the per-head keys and values the attention call received [batch, heads, T, dim],
    # decompressed from the latent cache (attention/latent.py)
    captured_keys: torch.Tensor | None = None
    captured_values: torch.Tensor | None = None

    def layer_inputs(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor | None = None,
                     rotary=None, memo=None) -> LayerInputs:
        return LayerInputs(self.module, self.layer_idx, self.n_layers, self.hidden, self.cos, self.sin,
                           keys, values, queries, rotary, memo, self.captured, self.layout)


def _call(module: torch.nn.Module, layer_idx: int, n_layers: int, args: tuple, kwargs: dict,
          captured: torch.Tensor | None = None, layout: LayerLayout | None = None) -> AttentionCall:
    hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
    cos, sin = kwargs.get("position_embeddings") or (None, None)
    return AttentionCall(module, layer_idx, n_layers, hidden, cos, sin, captured, layout)


def _hooked(model) -> list[tuple[int, torch.nn.Module]]:
    """(layer index, attention module) of every layer with a softmax attention (linear layers have none)."""
    return [(i, module) for i, module in enumerate(attention_modules(model)) if module is not None]


@contextmanager
def _registered(handles: Iterable[RemovableHandle]) -> Iterator[None]:
    made: list[RemovableHandle] = []
    try:
        made.extend(handles)  # registered inside the try: a failure half-way removes those made
        yield
    finally:
        for handle in made:
            handle.remove()


@contextmanager
def after_attention(model, hook: Callable[[AttentionCall], None]) -> Iterator[None]:
    """While active, hook(call) runs after each softmax attention layer's forward (the layer's keys and values
    are in the cache by then). Families whose queries only the attention call knows have them captured."""
    layout = describe(model)
    n_layers = len(layout.layers)
    latent = any(layer.latent for layer in layout.layers)
    with ExitStack() as stack:
        calls = stack.enter_context(capturing_queries(model, keep_kv=latent)) if layout.needs_capture or latent \
            else None

        def for_layer(layer_idx: int):
            layer = layout.layers[layer_idx]
            wants = layer.queries != PROJECTION and calls is not None

            def after(module, args, kwargs, output):
                captured = calls.take(layer_idx) if wants else None
                call = _call(module, layer_idx, n_layers, args, kwargs, captured, layer)
                if layer.latent and calls is not None:
                    keys, values = calls.take_keys_values(layer_idx)
                    call = replace(call, captured_keys=keys, captured_values=values)
                hook(call)

            return after

        stack.enter_context(_registered(module.register_forward_hook(for_layer(i), with_kwargs=True)
                                        for i, module in _hooked(model)))
        yield


@contextmanager
def attention_masks(model, mask_for: Callable[[AttentionCall], torch.Tensor]) -> Iterator[None]:
    """While active, each softmax attention layer's forward gets mask_for(call) as its attention_mask."""
    layout = describe(model)
    n_layers = len(layout.layers)

    def for_layer(layer_idx: int):
        def set_mask(module, args, kwargs):
            call = _call(module, layer_idx, n_layers, args, kwargs, layout=layout.layers[layer_idx])
            kwargs["attention_mask"] = mask_for(call)
            return args, kwargs

        return set_mask

    with _registered(module.register_forward_pre_hook(for_layer(i), with_kwargs=True) for i, module in _hooked(model)):
        yield


class ProjectedQueries:
    """q_proj's output of each layer's latest forward, waiting for the hook after that attention."""

    def __init__(self) -> None:
        self._by_layer: dict[int, torch.Tensor] = {}

    def take(self, call: AttentionCall) -> torch.Tensor | None:
        """The layer's projected queries, if they belong to this call's tokens (else None: the method
        projects them itself). Taken once."""
        projected = self._by_layer.pop(call.layer_idx, None)
        return projected if projected is not None and projected.shape[:2] == call.hidden.shape[:2] else None


@contextmanager
def projected_queries(model) -> Iterator[ProjectedQueries]:
    """While active, keeps each layer's q_proj output (layers whose queries the hooks recompute from it)."""
    store = ProjectedQueries()
    layout = describe(model)

    def for_layer(layer_idx: int):
        return lambda module, args, output: store._by_layer.__setitem__(layer_idx, output)

    with _registered(module.q_proj.register_forward_hook(for_layer(i)) for i, module in _hooked(model)
                     if layout.layers[i].queries == PROJECTION and isinstance(getattr(module, "q_proj", None),
                                                                              torch.nn.Module)):
        yield store
