"""expected_attention: keep the keys that future queries are expected to attend to (query-agnostic).

Devoto et al. 2025, "Expected Attention: KV Cache Compression by Estimating Attention from Future Queries
Distribution" (kvpress ExpectedAttentionPress). Future queries are modelled as a Gaussian whose mean and
covariance are those of the prompt's pre-RoPE queries (the first `n_sink` positions left out as
outliers), rotated by RoPE averaged over the next `n_future_positions` positions. For a Gaussian query
the expected exp(q.k/sqrt(d)) is exp(mu.k/sqrt(d) + k^T Sigma k / (2d)); its softmax over the keys,
averaged over the query heads sharing a KV head, is the score, multiplied by ||v||_2 (after adding
`epsilon`) when use_vnorm. The first n_sink tokens are always kept. No observation window is used,
so it suits the query_agnostic protocol. Defaults n_future_positions=512, n_sink=4, use_covariance=True,
use_vnorm=True, epsilon=0 are ExpectedAttentionPress's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..core.base import Method, param
from ..core.capabilities import SCORER, Capability
from ..core.kernel_memo import layer_kernel
from ..core.layer_inputs import LayerInputs
from ..core.precision import score_dtype


def averaged_rope_rotation(layer: LayerInputs, start: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """[head_dim, head_dim] mean over positions start..start+count-1 of the RoPE rotation matrix
    R_p, with R_p x = x cos_p + rotate_half(x) sin_p."""
    cos, sin = layer.rope_at(torch.arange(start, start + count))
    cos, sin = cos.to(dtype).mean(dim=0), sin.to(dtype).mean(dim=0)  # R is linear in (cos, sin)
    dim, half = cos.shape[-1], cos.shape[-1] // 2
    rotate_half = torch.zeros(dim, dim, dtype=dtype, device=cos.device)
    rotate_half[:half, half:] = -torch.eye(half, dtype=dtype, device=cos.device)
    rotate_half[half:, :half] = torch.eye(half, dtype=dtype, device=cos.device)
    return torch.diag(cos) + sin.unsqueeze(0) * rotate_half


class FutureQueries(NamedTuple):
    """The prompt's pre-RoPE queries as a model of the future ones (expected_attention, capkv)."""

    sink: int  # leading positions left out as outliers (at most T - 1)
    queries: torch.Tensor  # [batch, q_heads, T - sink, dim] pre-RoPE queries after the sinks
    rotation: torch.Tensor  # [dim, dim] RoPE rotation averaged over the next n_future_positions positions
    mean: torch.Tensor  # [batch, q_heads, dim] the queries' mean, rotated by `rotation`


def future_queries(layer: LayerInputs, n_future_positions: int, n_sink: int, dtype: torch.dtype) -> FutureQueries:
    """The pre-RoPE queries after the first n_sink positions, and their mean rotated to the future positions."""
    sink = min(n_sink, layer.seq_len - 1)
    queries = layer.queries(rope=False).to(dtype)[:, :, sink:]
    rotation = averaged_rope_rotation(layer, layer.future_start, n_future_positions, dtype)
    return FutureQueries(sink, queries, rotation, queries.mean(dim=2) @ rotation.T)


def prepend_sinks(scores: torch.Tensor, sink: int) -> torch.Tensor:
    """[batch, kv_heads, sink + n]: the scores of the non-sink positions after `sink` +inf (always kept)."""
    sinks = scores.new_full((*scores.shape[:2], sink), float("inf"))
    return torch.cat([sinks, scores], dim=-1)


@layer_kernel
def expected_attention_scores(layer: LayerInputs, n_future_positions: int, n_sink: int, use_covariance: bool,
                              use_vnorm: bool, epsilon: float) -> torch.Tensor:
    """[batch, kv_heads, T] scores (the first n_sink +inf); they do not depend on the budget, so the
    selections of a shared prefill compute them once per layer."""
    dtype = score_dtype(layer.keys)
    sink, queries, rotation, mean = future_queries(layer, n_future_positions, n_sink, dtype)
    batch, kv_heads, groups, dim = layer.keys.shape[0], layer.num_kv_heads, layer.num_groups, layer.head_dim
    keys = layer.keys[:, :, sink:].to(dtype)  # [batch, kv_heads, n, dim]
    keys_per_query_head = keys.repeat_interleave(groups, dim=1)
    logits = (keys_per_query_head @ mean.unsqueeze(-1)).squeeze(-1) / dim**0.5  # [batch, q_heads, n]
    if use_covariance:
        centered = queries - queries.mean(dim=2, keepdim=True)
        covariance = centered.transpose(-1, -2) @ centered / queries.shape[2]  # [batch, q_heads, dim, dim]
        covariance = rotation @ covariance @ rotation.T
        quadratic = ((keys_per_query_head @ covariance) * keys_per_query_head).sum(dim=-1)
        logits = logits + quadratic / dim / 2
    scores = logits.softmax(dim=-1).view(batch, kv_heads, groups, -1).mean(dim=2)
    if use_vnorm:
        scores = (scores + epsilon) * layer.values[:, :, sink:].to(dtype).norm(dim=-1)
    return prepend_sinks(scores, sink)


@dataclass
class ExpectedAttention(Method):
    name = "expected_attention"
    paper = "Devoto et al. 2025, Expected Attention (kvpress)"
    capabilities = SCORER | Capability.PRE_ROPE_QUERIES
    kvpress_press = "ExpectedAttentionPress"
    n_future_positions: int = param(512, "future positions the RoPE rotation is averaged over", minimum=1)
    n_sink: int = param(4, "first tokens always kept and left out of the query statistics", minimum=0)
    use_covariance: bool = param(True, "include the queries' covariance term")
    use_vnorm: bool = param(True, "multiply scores by the value norm")
    epsilon: float = param(0.0, "added to the scores before the value-norm rescaling", minimum=0.0)

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        return expected_attention_scores(layer, self.n_future_positions, self.n_sink, self.use_covariance,
                                         self.use_vnorm, self.epsilon)
