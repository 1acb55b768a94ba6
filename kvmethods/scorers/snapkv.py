"""snapkv: keep what the observation window attends to.

Li et al. 2024, "SnapKV: LLM Knows What You are Looking for Before Generation" (arXiv:2404.14469). The
last `window` prompt queries vote: their softmax attention is summed over the window, averaged over the
query heads sharing a KV head (GQA), smoothed along positions by a stride-1 pooling of size `kernel`,
and the top (budget - window) earlier positions are kept per KV head together with the window itself.
Defaults window=32 and kernel=7 are the SnapKV LongBench settings (FasterDecoding/SnapKV, also used by
KVCache-Factory's LongBench runs); avgpool is the SnapKV cluster's default pooling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.base import Method, param
from ..core.capabilities import SCORER
from ..core.layer_inputs import LayerInputs
from .scoring import pool_positions, protect_last, window_attention

POOLINGS = ("avgpool", "maxpool", "none")


@dataclass
class SnapKV(Method):
    name = "snapkv"
    paper = "Li et al. 2024, SnapKV (arXiv 2404.14469)"
    capabilities = SCORER
    kvpress_press = "SnapKVPress"
    kvpress_defaults = "window=64:kernel=5"
    kvpress_name = "snapkv"
    kvcache_factory_name = "SnapKV"
    window: int = param(32, "observation window: last prompt queries that vote, always kept", minimum=1)
    kernel: int = param(7, "pooling kernel size along positions (odd)", minimum=1, odd=True)
    pooling: str = param("avgpool", "pooling of the window's attention", choices=POOLINGS)

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        window = min(self.window, n_keep)
        # mean over the window (the ranking is the sum's; the scale matters to wrappers adding epsilon: criticalkv)
        votes = window_attention(layer, window).mean(dim=3).mean(dim=2)  # [batch, kv_heads, T]
        prefix = layer.seq_len - window
        scores = torch.empty_like(votes)
        scores[..., :prefix] = pool_positions(votes[..., :prefix], self.kernel, self.pooling)
        return protect_last(scores, window)
