"""sdpa over a masked multi-token forward without repeating the KV heads, on CPU.

transformers' sdpa attention passes `enable_gqa` to torch only without a mask (a mask sends CUDA's GQA to the math
kernel); with a mask and more than one query it copies every KV head once per query head of its group
(`repeat_kv`). A batch's teacher-forced forward (batched_generation: every member fed the reference's output,
a mask per member) is such a forward, over a batch of whole caches: on a CPU the copy costs several times the
attention itself (SmolLM2-135M, 3 KV heads for 9 query heads, 6 KIVI members at ~1,950 tokens: 32 ms per layer
with the copies against 7 without; the outputs are bit for bit the same). torch's CPU kernels take `enable_gqa`
with a mask, so this attention function, registered with transformers' public AttentionInterface and named by
the model only inside `masked_gqa(model)`, calls sdpa so; every other call (one query, no mask, CUDA, a
position bias or softcap) goes to transformers' own sdpa attention unchanged. The model's forward is not replaced.

Inside a padded batch (`masked_gqa(model, cache)`, batched_generation) the batch's rows are padded to the layer's
longest member: most of a [B, heads, P] batch's slots can be padding (shorter budgets, pyramidkv's lower layers,
adakv's fullest heads). Its layers hold each row's kept tokens right-aligned (storage/batched.BatchedLayer), so a
group of rows needs only the slots from its own longest row's first token on: where the layer offers
`buckets()`, each group of rows attends over its own slice (the same mask, sliced), one sdpa call per group, and
the outputs are stacked back. Masked slots weigh nothing, so the result is the same attention, up to the float
rounding of a shorter sequence.

A decoding step of a half-precision (bfloat16, float16) model on CPU, one query per row, is computed here in
float32 matmuls (`_one_query_in_float32`): torch's CPU sdpa kernels in bfloat16 spend 5-10x longer on one query
over thousands of keys, which made a bfloat16 model's decoding at 4k tokens slower than float32's. Decoding loops
open `masked_gqa(model)` around their steps (generation.decode_greedy, batched_generation) for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from .attention_hooks import attention_function
from ..adapters.transformers_compat import attention_implementation, register_attention, sdpa_attention_forward, sdpa_mask

ATTENTION_NAME = "kvbench_sdpa_masked_gqa"
_TORCH_HAS_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)  # sdpa's enable_gqa
_active: ContextVar = ContextVar("kvbench_masked_gqa", default=False)


def masked_gqa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                         is_causal: bool | None = None, **kwargs):
    """A transformers attention function: sdpa with enable_gqa for a masked multi-token forward on CPU, else
    transformers' sdpa attention; in a padded batch, each group of rows over its own slice of the keys."""
    buckets = _buckets(module, key, attention_mask)
    if buckets is None:
        return _attention(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs)
    outputs = [_attention(module, query[first:end], key[first:end, :, start:], value[first:end, :, start:],
                          attention_mask[first:end, :, :, start:], dropout, scaling, is_causal, **kwargs)[0]
               for first, end, start in buckets]
    return torch.cat(outputs), None


def _buckets(module, key, attention_mask) -> list[tuple[int, int, int]] | None:
    """The groups of rows of this layer of the active batch (BatchedLayer.buckets), None where it has none."""
    cache = _active.get()
    index = getattr(module, "layer_idx", None)
    if not hasattr(cache, "layers") or index is None or attention_mask is None or attention_mask.dim() != 4:
        return None
    layer = cache.layers[index] if index < len(cache.layers) else None
    if not hasattr(layer, "buckets") or layer.batch_size != key.shape[0] or \
            attention_mask.shape[0] != key.shape[0] or attention_mask.shape[-1] != key.shape[-2]:
        return None
    buckets = layer.buckets()
    return buckets if len(buckets) > 1 else None


def _attention(module, query, key, value, attention_mask, dropout, scaling, is_causal, **kwargs):
    if _one_query_in_float32_fits(query, key, dropout, kwargs):
        return _one_query_in_float32(query, key, value, attention_mask, scaling), None
    if key.dtype != query.dtype:  # a float32 working cache (decoding_cache_dtype) where this step cannot use it
        key, value = key.to(query.dtype), value.to(query.dtype)
    groups = getattr(module, "num_key_value_groups", 1)
    if (attention_mask is None or query.shape[2] == 1 or groups == 1 or query.device.type != "cpu"
            or any(kwargs.get(name) is not None for name in ("position_bias", "softcap"))
            or kwargs.get("output_attentions", False)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


# Extra arguments that change the attention itself (T5's bias, Gemma 2's softcap, gpt-oss's sink logits): with any,
# transformers' sdpa attention runs instead of the float32 single-query path.
_CHANGES_ATTENTION = ("position_bias", "softcap", "s_aux", "sinks")


def _one_query_in_float32_fits(query, key, dropout: float, kwargs) -> bool:
    """A decoding step of a half-precision model on CPU: one query per row, nothing but a mask changing it."""
    return (half_precision_on_cpu(query) and query.shape[2] == 1
            and not dropout and query.shape[1] % key.shape[1] == 0 and not kwargs.get("output_attentions", False)
            and all(kwargs.get(name) is None for name in _CHANGES_ATTENTION))


def _one_query_in_float32(query, key, value, attention_mask, scaling):
    """[batch, 1, heads, dim] attention of one query per row over `key`/`value`, computed in float32 with the
    query heads of a KV head grouped (no repeated KV heads), returned in the query's dtype. For a decoding step
    of a bfloat16 model on CPU, torch's sdpa kernels took 5-10x longer than these float32 matmuls (SmolLM2's
    shapes, 4,096 keys: 4.5-5.9 ms a layer against 0.55-0.66; docs/performance.md), and compute in float32
    inside as well, so the output agrees with theirs up to the rounding of the order of the sums."""
    batch, heads, _, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[-2]
    groups = heads // kv_heads
    scale = dim ** -0.5 if scaling is None else scaling
    logits = torch.matmul(query.reshape(batch, kv_heads, groups, dim).float(), key.float().transpose(-1, -2))
    logits.mul_(scale)  # [batch, kv_heads, groups, length]
    if attention_mask is not None:
        mask = attention_mask[:, :, -1, :length]  # [batch, 1 or heads, length]
        mask = mask.reshape(batch, 1, 1, length) if mask.shape[1] == 1 else mask.reshape(batch, kv_heads, groups,
                                                                                           length)
        if mask.dtype == torch.bool:
            logits.masked_fill_(~mask, float("-inf"))
        else:
            logits.add_(mask.float())
    out = torch.matmul(torch.softmax(logits, dim=-1), value.float())  # [batch, kv_heads, groups, value dim]
    return out.reshape(batch, heads, 1, -1).transpose(1, 2).contiguous().to(query.dtype)


def half_precision_on_cpu(tensor: torch.Tensor) -> bool:
    """Whether a tensor is bfloat16 or float16 on CPU: where a decoding step attends in float32."""
    return tensor.device.type == "cpu" and tensor.dtype in (torch.bfloat16, torch.float16)


def decoding_cache_dtype(model) -> torch.dtype | None:
    """float32 where masked_gqa computes a model's decoding steps in float32 (a half-precision model on CPU running
    sdpa), else None. A cache that only decoding steps read can then hold its keys and values in float32,
    converted once and exactly (every half-precision value is a float32 one), instead of at every step and
    layer: the same float32 attention, bit for bit, without the conversion. A step that cannot take the float32
    road (a softcap, sink logits) gets them back in the model's dtype."""
    if _TORCH_HAS_GQA and attention_implementation(model) == "sdpa" and half_precision_on_cpu(next(model.parameters())):
        return torch.float32
    return None


register_attention(ATTENTION_NAME, masked_gqa_attention, sdpa_mask)


@contextmanager
def masked_gqa(model, cache=None) -> Iterator[None]:
    """While active, a model running transformers' sdpa on CPU attends with masked_gqa_attention (the rows of
    `cache`'s layers that offer buckets() in groups, a half-precision decoding step in float32); any other model
    is left as it is."""
    if not _TORCH_HAS_GQA or attention_implementation(model) != "sdpa" or \
            next(model.parameters()).device.type != "cpu":
        yield
        return
    with attention_function(model, ATTENTION_NAME, _active, True if cache is None else cache):
        yield
