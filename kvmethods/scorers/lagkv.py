"""lagkv: score each partition of the prompt against the statistics of the partition after it.

Liang et al. 2025, "LagKV: Lag-Relative Information of the KV Cache Tells Which Tokens Are Important"
(arXiv:2504.04704). After the first `n_sink` tokens the prompt is cut into partitions of `lag_size` tokens. Each
partition's keys are min-max scaled per channel by the range of the *next* partition's keys (the lag reference),
and a token's key score is the standard deviation of its scaled channels, softmaxed over its partition; values
are scored the same way and the two averaged. Without `cross_scoring` a token's score is its rank within its
partition over `lag_size`, so every partition keeps about the same share. The sinks and the last partition
(no reference after it) plus the remainder are always kept; a prompt shorter than `n_sink + 2 x lag_size` keeps
its sinks and its most recent tokens. Attention-free: only the cached keys and values are read. Defaults are
LagKVPress's (n_sink=4, lag_size=128, cross_scoring=false).

Ties: ranks repeat across partitions, so a budget that does not split evenly over the partitions ties at the
boundary; kvmethods keeps the earlier partition's token (its stable sort), kvpress whichever `topk` returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.kernel_memo import layer_kernel
from ..core.base import Method, param
from ..core.capabilities import SCORER
from ..core.layer_inputs import LayerInputs
from .scoring import score_dtype


def lag_relative_scores(states: torch.Tensor, lag_size: int) -> torch.Tensor:
    """[batch, heads, P - 1, lag_size] scores of the first P - 1 partitions of `states` [batch, heads, P, lag_size,
    dim]: per token, the std of its channels min-max scaled by the next partition's range, softmaxed per partition."""
    reference = states[:, :, 1:]
    low, high = reference.amin(dim=-2, keepdim=True), reference.amax(dim=-2, keepdim=True)
    return ((states[:, :, :-1] - low) / (high - low)).std(dim=-1).softmax(dim=-1)


@dataclass
class LagKV(Method):
    name = "lagkv"
    paper = "Liang et al. 2025, LagKV (arXiv 2504.04704)"
    capabilities = SCORER
    kvpress_press = "LagKVPress"
    kvpress_name = "lagkv"
    n_sink: int = param(4, "first tokens always kept", minimum=0)
    lag_size: int = param(128, "tokens per partition; each is scored against the next one's range", minimum=1)
    cross_scoring: bool = param(False, "rank tokens across partitions by their softmaxed score instead of "
                                       "within their partition")

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        return lagkv_scores(layer, self.n_sink, self.lag_size, self.cross_scoring)


@layer_kernel
def lagkv_scores(layer: LayerInputs, n_sink: int, lag: int, cross_scoring: bool) -> torch.Tensor:
    """[batch, kv_heads, T] LagKV's scores (1 for what is always kept); independent of the budget, so the
    selections of a shared prefill compute them once per layer."""
    dtype = score_dtype(layer.keys)
    batch, heads, T, dim = layer.keys.shape
    sink = min(n_sink, T)
    scores = torch.ones(batch, heads, T, dtype=dtype, device=layer.keys.device)
    if T < n_sink + 2 * lag:  # too short for a partition and its reference: keep the most recent
        scores[..., sink:] = torch.arange(T - sink, device=scores.device, dtype=dtype) / max(1, T - sink)
        return scores
    end = sink + (T - sink) // lag * lag  # the last whole partition is only a reference; after it, the rest
    partitions = (end - sink) // lag
    key_scores, value_scores = (
        lag_relative_scores(states[:, :, sink:end].to(dtype).view(batch, heads, partitions, lag, dim), lag)
        for states in (layer.keys, layer.values))
    scored = (key_scores + value_scores) / 2  # [batch, heads, partitions - 1, lag]
    if not cross_scoring:
        scored = scored.argsort(dim=-1).argsort(dim=-1).to(dtype) / lag
    scores[..., sink:end - lag] = scored.reshape(batch, heads, -1)
    return scores
