"""The forward-hook machinery that compresses the cache during prefill, layer by layer.

Compression never replaces an attention forward. A forward hook on each layer's attention module
(attention_hooks.after_attention) runs right after that layer has written its keys/values into the
DynamicCache: it hands the method a LayerInputs (with the q_proj output, kept by attention_hooks.projected_queries
so that queries need not be projected twice), gathers the kept positions per KV head and writes the
smaller tensors back through the cache layer's public `keys`/`values`. So the full-length cache of a
layer is freed before the next layer runs, and the prefill itself (sdpa, full attention) is unchanged.

After compression layers may hold different lengths (PyramidKV). The model builds one causal mask from
layer 0's length, so for later forwards a pre-hook installs a mask sized to each layer's own cache
(`ragged.visibility_mask`; create_causal_mask has no layer_idx in transformers 5.2, kvpress' pin); a
head-adaptive selection (a bool mask, AdaKV) is stored as a `ragged.RaggedLayer` with a per-head mask.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch

from .attention_hooks import AttentionCall, after_attention, attention_masks, projected_queries
from ..core.base import Method
from ..core.capabilities import Capability
from ..core.errors import MethodError
from .families import decoder_layers, rotary_embedding
from ..core.layout import COMPRESS, SLIDING
from ..core.layer_inputs import LayerInputs
from ..storage.ragged import RaggedLayer, visibility_mask
from .latent import holds_latent, latent_kept_indices
from ..storage.window_layer import WindowLayer, keep_window
from ..adapters.transformers_compat import DynamicCache


def _validated(indices: torch.Tensor, method: Method, shape: tuple[int, ...], seq_len: int) -> torch.Tensor:
    if not isinstance(indices, torch.Tensor) or tuple(indices.shape) != shape or indices.is_floating_point():
        got = tuple(indices.shape) if isinstance(indices, torch.Tensor) else type(indices).__name__
        raise MethodError(f"{method.name}: kept_indices must be an integer tensor of shape {shape}, got {got}")
    if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= seq_len):
        raise MethodError(f"{method.name}: kept_indices out of range [0, {seq_len})")
    if bool((indices.sort(dim=-1).values.diff(dim=-1) == 0).any()):
        raise MethodError(f"{method.name}: kept_indices repeat a position")
    return indices.long()


def _validated_mask(mask: torch.Tensor, method: Method, shape: tuple[int, ...], n_keep: int | None) -> torch.Tensor:
    """n_keep None: the layer's total is free (a budget shared across layers)."""
    batch, heads, seq_len = shape
    if tuple(mask.shape) != (batch, heads, seq_len) or batch != 1:
        raise MethodError(f"{method.name}: a head-adaptive kept mask must have shape (1, {heads}, {seq_len}), "
                          f"got {tuple(mask.shape)}")
    counts = mask.sum(dim=-1)
    total = heads * n_keep if n_keep is not None else int(counts.sum())
    if int(counts.sum()) != total or int(counts.min()) < 1:
        raise MethodError(f"{method.name}: a head-adaptive kept mask must keep {total} positions in all, "
                          f"at least one per head; got {counts.tolist()}")
    return mask


def store_selection(cache: DynamicCache, layer_idx: int, method: Method, selection: torch.Tensor,
                    n_keep: int | None) -> torch.Tensor:
    """Shrink layer `layer_idx` of `cache` to the selection: kept indices [batch, kv_heads, n_keep] gathered
    in place, or a head-adaptive bool mask [1, kv_heads, T] stored as a RaggedLayer (n_keep None: a mask
    from a budget shared across layers), or None from a method that keeps some layers whole (the layer stays as
    it is). Returns the selection."""
    layer = cache.layers[layer_idx]
    keys, values = layer.keys, layer.values
    if selection is None and Capability.KEEPS_LAYERS_WHOLE in method.capabilities:  # this layer keeps everything
        return None
    if isinstance(selection, torch.Tensor) and selection.dtype == torch.bool:
        if Capability.HEAD_ADAPTIVE not in method.capabilities:  # undeclared, chunks/per_turn/compositions take it
            raise MethodError(f"{method.name}: selected a head-adaptive mask but does not declare "
                              f"Capability.HEAD_ADAPTIVE")
        mask = _validated_mask(selection, method, tuple(keys.shape[:3]), n_keep)
        cache.layers[layer_idx] = RaggedLayer(keys, values, mask)
        return mask
    indices = _validated(selection, method, (*keys.shape[:2], n_keep), keys.shape[-2])
    gather = indices.unsqueeze(-1)  # values may be narrower than keys (DeepSeek-V3's decompressed latent cache)
    layer.keys = keys.gather(2, gather.expand(-1, -1, -1, keys.shape[-1]))
    if Capability.MERGES_VALUES in method.capabilities:  # the evicted values folded into the kept ones (merge)
        layer.values = method.kept_values(keys, values, indices)
    else:
        layer.values = values.gather(2, gather.expand(-1, -1, -1, values.shape[-1]))
    return indices


def window_inputs(inputs: LayerInputs, layer: WindowLayer) -> LayerInputs:
    """What a method sees of a window layer: its held tokens as a short prompt, whose last tokens are the
    forward's last (the queries of the forward's last min(tokens, held) positions), keys at the layer's positions
    (`next_position`: where the next token goes, for methods rotating queries to future positions)."""
    held = layer.keys.shape[-2]
    last = min(held, inputs.hidden_states.shape[1])

    def tail(tensor, dim=1):
        return None if tensor is None else tensor.narrow(dim, tensor.shape[dim] - last, last)

    return replace(inputs, hidden_states=tail(inputs.hidden_states), cos=tail(inputs.cos), sin=tail(inputs.sin),
                   projected_queries=tail(inputs.projected_queries), captured_queries=tail(inputs.captured_queries, 2),
                   next_position=layer.next_position)


def compress_window(cache: DynamicCache, call: AttentionCall, method: Method, n_keep: int, queries,
                    rotary, memo=None) -> torch.Tensor:
    """Sliding layers compressed too (`Method.sliding_layers` "compress"): the window layer `call.layer_idx` of
    `cache` cut to `n_keep` tokens per KV head by the method, scoring the window's tokens (window_inputs); a
    window within the budget stays whole. Returns the kept positions [batch, kv_heads, n]."""
    layer = cache.layers[call.layer_idx]
    held = layer.keys.shape[-2]
    if n_keep >= held:
        return layer.positions
    inputs = window_inputs(call.layer_inputs(layer.keys, layer.values, queries, rotary, memo), layer)
    layer.select(_validated(method.kept_indices(inputs, n_keep), method, (*layer.keys.shape[:2], n_keep), held))
    return layer.positions


def layer_selection(method: Method, call: AttentionCall, layer, n_keep: int, queries=None, rotary=None,
                    memo=None) -> torch.Tensor:
    """The method's kept positions of a cache layer after `call`: per KV head from the layer's own keys and
    values, or, for MLA's latent cache, one set for every head scored from the decompressed keys (latent.py)."""
    if holds_latent(layer, call.captured_keys):
        inputs = call.layer_inputs(call.captured_keys, call.captured_values, queries, rotary, memo)
        return latent_kept_indices(method, inputs, n_keep)
    return method.kept_indices(call.layer_inputs(layer.keys, layer.values, queries, rotary, memo), n_keep)


@contextmanager
def compressing_prefill(model, method: Method, layer_budgets: list[int], cache: DynamicCache) -> Iterator[list]:
    """While active, every forward compresses layer i of `cache` to layer_budgets[i] tokens.
    Yields a list filled with each layer's kept indices [batch, num_kv_heads, n], or its head-adaptive bool
    mask [1, num_kv_heads, T] (None if untouched)."""
    rotary = rotary_embedding(model)
    kept: list[torch.Tensor | None] = [None] * len(decoder_layers(model))

    def compress(call: AttentionCall) -> None:
        layer = cache.layers[call.layer_idx]
        queries = projected.take(call)
        if call.layout is not None and call.layout.kind == SLIDING:  # kept as its window (and maybe compressed)
            kept[call.layer_idx] = keep_window(cache, call.layer_idx, call.layout.window)
            if method.sliding_layers == COMPRESS:
                kept[call.layer_idx] = compress_window(cache, call, method, layer_budgets[call.layer_idx], queries,
                                                       rotary)
            return
        n_keep = layer_budgets[call.layer_idx]
        if n_keep >= layer.keys.shape[-2]:
            return
        kept[call.layer_idx] = store_selection(cache, call.layer_idx, method,
                                               layer_selection(method, call, layer, n_keep, queries, rotary), n_keep)

    with projected_queries(model) as projected, after_attention(model, compress):
        yield kept


@contextmanager
def capturing_window_queries(model, cache: DynamicCache, window: int) -> Iterator[dict[int, torch.Tensor]]:
    """While active, each attention forward records its last `window` queries (RoPE'd, [batch, q_heads, w,
    head_dim]) per layer: what a channel-pruning storage (ThinK) scores with, after the prefill."""
    queries: dict[int, torch.Tensor] = {}

    def record(call: AttentionCall) -> None:
        layer = cache.layers[call.layer_idx]
        queries[call.layer_idx] = call.layer_inputs(layer.keys, layer.values).queries(
            last=min(window, call.hidden.shape[1]))

    with after_attention(model, record):
        yield queries


@contextmanager
def per_layer_causal_masks(model, cache: DynamicCache) -> Iterator[None]:
    """While active, each attention module gets a causal mask sized to its own cache layer."""

    def mask_for(call: AttentionCall) -> torch.Tensor | None:
        layer, new_tokens = cache.layers[call.layer_idx], call.hidden.shape[1]
        if isinstance(layer, RaggedLayer):
            return layer.attention_mask(new_tokens, call.module.config.num_attention_heads, call.hidden.dtype)
        if isinstance(layer, WindowLayer):  # a sliding layer sees its window, by positions
            return layer.attention_mask(new_tokens, call.hidden.dtype, call.hidden.device,
                                        call.module.config.num_attention_heads)
        if new_tokens == 1:  # a decoding step sees the whole layer: no mask, sdpa's unmasked (GQA) path
            return None
        # every head sees the layer's cache, then the new tokens causally (the length is known on the host)
        length = layer.get_seq_length()
        kept = torch.full((1,), length, device=call.hidden.device)
        return visibility_mask(kept, length, 0, new_tokens, call.hidden.dtype)

    with attention_masks(model, mask_for):
        yield
