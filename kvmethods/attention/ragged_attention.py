"""Attention over a ragged cache with flash-attn's variable-length kernel, on CUDA, when flash-attn is installed.

A head-adaptive cache (`ragged.RaggedLayer`) keeps a different number of prompt tokens per KV head. The
portable path pads the heads to the longest one and hides the padding with a per-head mask; on a GPU,
flash-attn's `flash_attn_varlen_func` (Dao et al., flash_attn/flash_attn_interface.py) attends over packed
sequences of different lengths instead, so nothing is padded:

- each KV head is one sequence: its kept prompt tokens, then the tail shared by all heads (the question of
  the query-agnostic protocol, decoded tokens, the tokens of this forward); `cu_seqlens_k` is the running
  sum of those lengths (int32, as documented), `max_seqlen_k` the longest;
- the queries of sequence h are the query heads that read KV head h (query head j reads KV head
  j // groups, as transformers' repeat_kv), passed as that sequence's `groups` heads against one KV head
  (the kernel's own GQA), every sequence `q_len` queries long;
- `causal=True` for a multi-token forward: the kernel aligns the mask to the bottom right, so query i sees
  the prompt tokens and the tail up to itself; a decoding step (one query) sees everything: `causal=False`.

It plugs in without touching a model's attention forward: the function is registered with transformers'
`AttentionInterface` and the model's attention implementation names it only while `ragged_attention()` is
active; layers that are not ragged go to transformers' own sdpa. The kernel takes half precision only, so
float32 models (and CPUs, and GPUs without flash-attn) keep the padded path, and `kernel_name()` writes
which one ran, and why the fallback, into the records.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from .attention_hooks import attention_function
from ..storage.ragged import KERNEL as PADDED_KERNEL
from ..storage.ragged import RaggedLayer
from ..adapters.transformers_compat import register_attention, sdpa_attention_forward, sdpa_mask

VARLEN_KERNEL = "flash_attn_varlen"
ATTENTION_NAME = "kvbench_ragged_varlen"  # the name registered with transformers' AttentionInterface
VARLEN_DTYPES = (torch.float16, torch.bfloat16)  # what flash-attn's kernels accept

_active_cache: ContextVar = ContextVar("kvbench_ragged_cache", default=None)


def varlen_function():
    """flash_attn.flash_attn_varlen_func, or None when flash-attn is not installed."""
    try:
        return importlib.import_module("flash_attn").flash_attn_varlen_func
    except (ImportError, AttributeError):
        return None


def on_cuda(model) -> bool:
    return next(model.parameters()).device.type == "cuda"


def kernel_name(model) -> str:
    """What attends over a ragged cache of this model: the varlen kernel, or the padded path and why."""
    if not on_cuda(model):
        return PADDED_KERNEL
    if varlen_function() is None:
        return f"{PADDED_KERNEL} (flash-attn not installed)"
    if next(model.parameters()).dtype not in VARLEN_DTYPES:
        return f"{PADDED_KERNEL} (flash-attn takes float16/bfloat16)"
    return VARLEN_KERNEL


def varlen_arguments(query: torch.Tensor, layer: RaggedLayer, tail_keys: torch.Tensor, tail_values: torch.Tensor,
                     scaling: float | None) -> dict:
    """flash_attn_varlen_func's arguments for queries [1, q_heads, q_len, dim] over a ragged layer whose tail
    (after this forward's tokens were appended) is tail_keys/tail_values [1, kv_heads, tail, dim]."""
    _, q_heads, q_len, dim = query.shape
    kv_heads = len(layer.head_keys)
    groups = q_heads // kv_heads
    # [kv_heads * q_len, groups, dim]: sequence h holds the q_len queries of query heads h*groups .. h*groups+groups-1
    packed_q = query[0].view(kv_heads, groups, q_len, dim).transpose(1, 2).reshape(kv_heads * q_len, groups, dim)
    keys = torch.cat([torch.cat([own, tail]) for own, tail in zip(layer.head_keys, tail_keys[0])]).unsqueeze(1)
    values = torch.cat([torch.cat([own, tail]) for own, tail in zip(layer.head_values, tail_values[0])]).unsqueeze(1)
    lengths = torch.tensor([n + tail_keys.shape[-2] for n in layer.kept_per_head], dtype=torch.int32)
    zero = torch.zeros(1, dtype=torch.int32)
    device = query.device
    return dict(q=packed_q.contiguous(), k=keys, v=values,
                cu_seqlens_q=torch.arange(0, (kv_heads + 1) * q_len, q_len, dtype=torch.int32, device=device),
                cu_seqlens_k=torch.cat([zero, lengths.cumsum(0, dtype=torch.int32)]).to(device),
                max_seqlen_q=q_len, max_seqlen_k=int(lengths.max()), dropout_p=0.0, softmax_scale=scaling,
                causal=q_len > 1)


def varlen_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs):
    """A transformers attention function: flash-attn varlen over a ragged layer, sdpa over any other."""
    cache = _active_cache.get()
    layer = cache.layers[module.layer_idx] if cache is not None else None
    if not isinstance(layer, RaggedLayer):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    batch, q_heads, q_len, dim = query.shape
    out = varlen_function()(**varlen_arguments(query, layer, key, value, scaling))  # [kv_heads * q_len, groups, dim]
    kv_heads = len(layer.head_keys)
    out = out.view(kv_heads, q_len, q_heads // kv_heads, dim).permute(1, 0, 2, 3)  # [q_len, kv_heads, groups, dim]
    return out.reshape(batch, q_len, q_heads, dim), None


register_attention(ATTENTION_NAME, varlen_attention, sdpa_mask)  # sdpa's mask for the layers that are not ragged


@contextmanager
def ragged_attention(model, cache) -> Iterator[None]:
    """While active, forwards over `cache` attend to its ragged layers with flash-attn's varlen kernel, when
    kernel_name(model) says it can run; otherwise nothing changes (the padded view)."""
    ragged = [layer for layer in cache.layers if isinstance(layer, RaggedLayer)]
    if not ragged or kernel_name(model) != VARLEN_KERNEL:
        yield
        return
    for layer in ragged:
        layer.packed_reads = True
    try:
        with attention_function(model, ATTENTION_NAME, _active_cache, cache):
            yield
    finally:
        for layer in ragged:
            layer.packed_reads = False
