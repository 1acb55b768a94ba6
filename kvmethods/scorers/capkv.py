"""capkv: keep the tokens that add most to the cache's capacity, weighted by how well they align with the queries.

CapKV (2026, "capacity-aware" KV cache eviction from the information-bottleneck view, arXiv 2604.25975), as
kvpress' CapPress computes it. Each token i gets a relevance weight w_i = exp(tau x cos(k_i, mu_q)), mu_q the mean
of the prompt's pre-RoPE queries (the first `n_sink` positions left out) rotated by RoPE averaged over the next
`n_future_positions` positions, as expected_attention does (keys and anchor L2-normalised, the weights shifted by
their maximum per head: the press's stabilisers). With the values as the output directions u_i = v_i, the capacity
matrix is A = I + sum_i (w_i + epsilon) v_i v_i^T over the non-sink tokens, and the score is
s_i = w_i x v_i^T A^-1 v_i: relevant tokens whose value direction the others do not already cover. Per query head,
averaged over the heads sharing a KV head; the first `n_sink` tokens are always kept. Defaults tau=5,
n_future_positions=512, n_sink=4, epsilon=1e-6 are CapPress's. The solve runs in float32, CapPress's precision.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.base import Method, param
from ..core.capabilities import SCORER, Capability
from ..core.kernel_memo import layer_kernel
from ..core.layer_inputs import LayerInputs
from .expected_attention import future_queries, prepend_sinks
from .scoring import score_dtype


@layer_kernel
def capacity_scores(layer: LayerInputs, tau: float, n_future_positions: int, n_sink: int,
                    epsilon: float) -> torch.Tensor:
    """[batch, kv_heads, T] scores (the first n_sink +inf); budget-independent, so computed once per layer."""
    dtype = score_dtype(layer.keys)
    future = future_queries(layer, n_future_positions, n_sink, dtype)
    sink, anchor = future.sink, future.mean
    groups = layer.num_groups
    keys = layer.keys[:, :, sink:].to(dtype).repeat_interleave(groups, dim=1)  # [batch, q_heads, n, dim]
    values = layer.values[:, :, sink:].to(dtype).repeat_interleave(groups, dim=1)
    alignment = torch.einsum("bhd,bhnd->bhn", torch.nn.functional.normalize(anchor, dim=-1),
                             torch.nn.functional.normalize(keys, dim=-1)).clamp(-1.0, 1.0)
    logits = tau * alignment
    weights = (logits - logits.amax(dim=-1, keepdim=True)).exp()
    scaled = values * (weights + epsilon).sqrt().unsqueeze(-1)
    eye = torch.eye(values.shape[-1], dtype=dtype, device=values.device)
    capacity = eye + scaled.transpose(-1, -2) @ scaled  # [batch, q_heads, dim, dim]
    directions = values.transpose(-1, -2).float()  # the solve in float32, as CapPress's
    leverage = (directions * torch.linalg.solve(capacity.float(), directions)).sum(dim=-2)  # [batch, q_heads, n]
    scores = (weights * leverage).view(layer.keys.shape[0], layer.num_kv_heads, groups, -1).mean(dim=2)
    return prepend_sinks(scores, sink)


@dataclass
class CapKV(Method):
    name = "capkv"
    paper = "CapKV 2026, capacity-aware KV cache eviction (arXiv 2604.25975)"
    capabilities = SCORER | Capability.PRE_ROPE_QUERIES
    kvpress_press = "CapPress"
    tau: float = param(5.0, "sharpness of the query-key alignment weights", minimum=0.0)
    n_future_positions: int = param(512, "future positions the RoPE rotation of the query anchor is averaged over",
                                    minimum=1)
    n_sink: int = param(4, "first tokens always kept and left out of the anchor and the capacity", minimum=0)
    epsilon: float = param(1e-6, "added to the weights inside the capacity matrix", minimum=0.0)

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        return capacity_scores(layer, self.tau, self.n_future_positions, self.n_sink, self.epsilon)
