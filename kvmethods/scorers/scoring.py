"""Attention-based scoring kernels shared by the methods, written for sdpa models and long prompts.

The model's sdpa/flash attention never materialises attention weights, so the methods recompute the
softmax rows they need from recomputed queries and the cached keys:
- `window_attention`: rows of the last n queries (SnapKV/PyramidKV observation window, TOVA's last token);
- `accumulated_attention`: column sums over *all* prompt queries (H2O), computed in query chunks whose
  scratch is bounded by SCRATCH_BYTES, so the T x T matrix never exists (the original H2O needs eager
  attention and runs out of memory on long prompts).
Both work per KV head without repeating keys: the G query heads of a group are stacked against their
shared keys. Window attention is computed in float32 (float64 for float64 models); accumulated attention's
products in the model's dtype on an accelerator (`product_dtype`), with float32 sums.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..core.kernel_memo import layer_kernel
from ..core.layer_inputs import LayerInputs
from ..core.precision import product_dtype, score_dtype

# Bound on the attention block materialised per chunk in accumulated_attention. On CPU a block that stays
# in cache is fastest; on accelerators larger blocks amortise kernel launches.
SCRATCH_BYTES = {"cpu": 4 * 2**20, "default": 256 * 2**20}


def _grouped_queries(layer: LayerInputs, last: int | None) -> torch.Tensor:
    """[batch, num_kv_heads, G, n, head_dim] float32 queries, grouped by the KV head they share."""
    q = layer.queries(last).to(score_dtype(layer.keys))
    batch, _, n, dim = q.shape
    return q.view(batch, layer.num_kv_heads, layer.num_groups, n, dim)


@layer_kernel
@torch.no_grad()
def window_attention(layer: LayerInputs, n: int) -> torch.Tensor:
    """[batch, num_kv_heads, G, n, T] softmax attention of the last n queries over all T keys (causal)."""
    q = _grouped_queries(layer, n)
    batch, kv_heads, groups, _, dim = q.shape
    keys = layer.keys.to(q.dtype)
    T = keys.shape[-2]
    logits = torch.matmul(q.reshape(batch, kv_heads, groups * n, dim), keys.transpose(-1, -2))
    logits = logits.mul_(layer.scaling).view(batch, kv_heads, groups, n, T)
    future = torch.ones(n, n, dtype=torch.bool, device=logits.device).triu_(1)
    logits[..., T - n :].masked_fill_(future, float("-inf"))
    return _softmax(logits, layer.sink_logits)


def _softmax(logits: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the keys of grouped logits [batch, kv_heads, G, rows, T]; learned sink logits [q_heads]
    (gpt-oss) enter the denominator as one more column, as in the model's attention, and are dropped."""
    if sinks is None:
        return logits.softmax(dim=-1)
    batch, kv_heads, groups, rows, _ = logits.shape
    column = sinks.to(logits.dtype).view(1, kv_heads, groups, 1, 1).expand(batch, kv_heads, groups, rows, 1)
    return torch.cat((logits, column), dim=-1).softmax(dim=-1)[..., :-1]


@layer_kernel
@torch.no_grad()
def accumulated_attention(layer: LayerInputs, scratch_bytes: int | None = None) -> torch.Tensor:
    """[batch, num_kv_heads, T] attention each key receives, summed over all T queries (causal),
    averaged over the query heads of the group. Works on blocks of query rows against the keys they
    can see, so the scratch is about 2 x `scratch_bytes` and the upper triangle is never computed.

    On an accelerator the logits and probabilities are in the model's dtype (`product_dtype`), as in H2O's
    reference (its attention in the model's half precision, softmax computed in float32 and cast back:
    FMInference/H2O, h2o_hf's modify_llama.py): for bf16 half the memory traffic of the blocks and
    tensor-core matmuls (an H200 took 6.4 s at 32k with float32 blocks, issue 36). On a CPU they stay float32.
    Each block's column sums and the totals are float32 (float64 for float64 models); float32 models compute
    as before, bit for bit."""
    q = layer.queries(None).to(product_dtype(layer.keys))
    sinks = layer.sink_logits
    batch, _, T, dim = q.shape
    kv_heads, groups = layer.num_kv_heads, layer.num_groups
    q = q.view(batch, kv_heads, groups, T, dim)
    if scratch_bytes is None:
        scratch_bytes = SCRATCH_BYTES.get(q.device.type, SCRATCH_BYTES["default"])
    q = q * layer.scaling
    keys_t = layer.keys.to(q.dtype).transpose(-1, -2).contiguous()  # [batch, kv_heads, dim, T]
    rows_per_chunk = max(1, scratch_bytes // (q.element_size() * batch * kv_heads * groups * T))
    rows_per_chunk = min(rows_per_chunk, T)
    # two reused buffers (logits, probabilities): fresh multi-MiB tensors per chunk cost page faults
    buffers = torch.empty(2, batch * kv_heads * groups * rows_per_chunk * T, dtype=q.dtype, device=q.device)
    totals = torch.zeros(batch, kv_heads, T, dtype=score_dtype(q), device=q.device)
    future = torch.ones(rows_per_chunk, rows_per_chunk, dtype=torch.bool, device=q.device).triu_(1)
    for start in range(0, T, rows_per_chunk):
        stop = min(T, start + rows_per_chunk)
        rows = stop - start
        shape = (batch, kv_heads, groups * rows, stop)
        size = batch * kv_heads * groups * rows * stop
        logits, probs = buffers[0, :size].view(shape), buffers[1, :size].view(shape)
        chunk = q[:, :, :, start:stop].reshape(batch, kv_heads, groups * rows, dim)
        torch.matmul(chunk, keys_t[..., :stop], out=logits)
        block = logits.view(batch, kv_heads, groups, rows, stop)[..., start:]
        block.masked_fill_(future[:rows, :rows], float("-inf"))
        if sinks is None:
            torch.softmax(logits, dim=-1, out=probs)  # float32 inside for half precision, as F.softmax
        else:
            probs.view(batch, kv_heads, groups, rows, stop).copy_(
                _softmax(logits.view(batch, kv_heads, groups, rows, stop), sinks))
        totals[..., :stop] += probs.sum(dim=-2, dtype=totals.dtype)
    return totals.div_(groups)


# Rows converted to score_dtype at a time by row_norms: a block that stays in cache (2 MiB of float32).
CONVERSION_BLOCK_BYTES = 2 * 2**20


def row_norms(states: torch.Tensor) -> torch.Tensor:
    """[...] L2 norms of the rows of `states` [..., dim] in score_dtype. Half-precision rows are converted a
    cache-sized block at a time: one float32 copy of a whole layer's keys costs the CPU more than the norms."""
    dtype = score_dtype(states)
    if states.dtype == dtype:
        return torch.linalg.vector_norm(states, dim=-1)
    rows = states.reshape(-1, states.shape[-1])
    out = torch.empty(rows.shape[0], dtype=dtype, device=states.device)
    step = max(1, CONVERSION_BLOCK_BYTES // (rows.shape[1] * out.element_size()))
    for start in range(0, rows.shape[0], step):
        torch.linalg.vector_norm(rows[start:start + step].to(dtype), dim=-1, out=out[start:start + step])
    return out.view(states.shape[:-1])


def pool_positions(scores: torch.Tensor, kernel: int, pooling: str) -> torch.Tensor:
    """Smooth scores along positions (SnapKV's clustering step): stride 1, same length, odd kernel."""
    if pooling == "none" or kernel <= 1:
        return scores
    shape = scores.shape
    flat = scores.reshape(-1, 1, shape[-1])
    if pooling == "avgpool":
        pooled = F.avg_pool1d(flat, kernel_size=kernel, stride=1, padding=kernel // 2)
    elif pooling == "maxpool":
        pooled = F.max_pool1d(flat, kernel_size=kernel, stride=1, padding=kernel // 2)
    else:
        raise ValueError(f"unknown pooling {pooling!r}")
    return pooled.reshape(shape)


def layer_generator(seed: int, layer_idx: int) -> torch.Generator:
    """A private CPU generator seeded per (seed, layer): reproducible, and the global RNG is left alone."""
    return torch.Generator().manual_seed(seed * 1_000_003 + layer_idx)


def protect_last(scores: torch.Tensor, n: int) -> torch.Tensor:
    """Mark the last n positions as always kept (score +inf)."""
    if n > 0:
        scores[..., -n:] = float("inf")
    return scores
