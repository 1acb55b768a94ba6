"""The queries and keyword arguments each attention call receives, taken from the call itself.

Where a family computes its queries in a way the hooks cannot redo from `q_proj` (phi3's fused `qkv_proj`,
qwen3_next's gated `q_proj`, olmo2's norm over the whole projection, cohere's interleaved rotation,
DeepSeek-V3's latent projections), the queries the method scores with are the ones the model itself hands its
attention function. While `capturing_queries()` is active the model's attention implementation is a function
registered with transformers' public AttentionInterface that keeps the RoPE'd queries and keyword arguments of
each layer and then calls the implementation that was active before (the family's own eager function for
"eager"), with the same mask function: the forward's numbers are the same bit for bit. The family probe
(attention/model_probe.py) uses it once per model to learn what each layer does; the hooks use it only for families
whose queries need it. Nothing of a forward is replaced.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from ..adapters.transformers_compat import (AttentionInterface, AttentionMaskInterface, attention_implementation,
                                            register_attention)

PREFIX = "kvbench_capture_"  # + the implementation it wraps: the name registered with AttentionInterface

_active: ContextVar = ContextVar("kvbench_query_capture", default=None)


@dataclass
class CapturedCalls:
    """Per layer, the latest attention call's queries [batch, q_heads, n, dim] and keyword arguments."""

    wrapped: str
    queries: dict[int, torch.Tensor] = field(default_factory=dict)
    kwargs: dict[int, dict] = field(default_factory=dict)
    keep_kwargs: bool = False
    # Also each call's keys and values [batch, heads, T, dim] (what attention ran on): MLA's decompressed ones,
    # which its latent cache does not hold (attention/latent.py).
    keep_kv: bool = False
    keys_values: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    def take(self, layer_idx: int) -> torch.Tensor | None:
        return self.queries.pop(layer_idx, None)

    def take_keys_values(self, layer_idx: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.keys_values.pop(layer_idx, (None, None))


def _wrapped_function(module, name: str):
    if name == "eager":  # the family's own eager function (gpt-oss' adds its sinks, gemma2's its soft-capping)
        return sys.modules[type(module).__module__].eager_attention_forward
    return AttentionInterface()[name]


def capturing_attention(module, query, key, value, attention_mask, **kwargs):
    calls: CapturedCalls = _active.get()
    layer_idx = getattr(module, "layer_idx", None)
    if layer_idx is not None:
        calls.queries[layer_idx] = query
        if calls.keep_kwargs:
            calls.kwargs[layer_idx] = dict(kwargs)
        if calls.keep_kv:
            calls.keys_values[layer_idx] = (key, value)
    return _wrapped_function(module, calls.wrapped)(module, query, key, value, attention_mask, **kwargs)


def _registered_name(wrapped: str) -> str:
    name = PREFIX + wrapped
    if name not in AttentionInterface().valid_keys():
        register_attention(name, capturing_attention, AttentionMaskInterface()[wrapped])
    return name


@contextmanager
def wrapping_instead(wrapped: str, replacement: str) -> Iterator[None]:
    """While active, the active capture of `wrapped` calls the implementation registered as `replacement` in its
    place (one that computes the same attention otherwise: attention/banded_attention.py); the capture stays
    outermost, so it keeps what the model handed the attention call."""
    calls: CapturedCalls | None = _active.get()
    if calls is None or calls.wrapped != wrapped:
        yield
        return
    calls.wrapped = replacement
    try:
        yield
    finally:
        calls.wrapped = wrapped


@contextmanager
def capturing_queries(model, keep_kwargs: bool = False, keep_kv: bool = False) -> Iterator[CapturedCalls]:
    """While active, each attention call's queries (and, keep_kwargs, its keyword arguments; keep_kv, its keys
    and values) are kept per layer; the forward computes what it computes without it."""
    previous = attention_implementation(model)
    if previous.startswith(PREFIX):  # already capturing (a nested block): share the outer store
        outer = _active.get()
        kept_kv = outer.keep_kv
        outer.keep_kv = kept_kv or keep_kv
        try:
            yield outer
        finally:
            outer.keep_kv = kept_kv
        return
    calls = CapturedCalls(previous, keep_kwargs=keep_kwargs, keep_kv=keep_kv)
    token = _active.set(calls)
    model.set_attn_implementation(_registered_name(previous))
    try:
        yield calls
    finally:
        model.set_attn_implementation(previous)
        _active.reset(token)
