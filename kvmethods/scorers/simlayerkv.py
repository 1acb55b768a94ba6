"""simlayerkv: a layer whose last queries look only at the first and the most recent tokens is "lazy" and keeps
just those; every other layer keeps its whole cache.

Zhang et al. 2024, "SimLayerKV: A Simple Framework for Layer-Level KV Cache Reduction" (arXiv 2410.13846).
Some layers attend almost only to the attention sinks and the recent tokens, whatever the prompt: those need no
more. The rule, as kvpress' SimLayerKVPress applies it at prefill: the softmax attention of the last `last` prompt
queries over the keys before them, averaged over every query head and those queries, is summed over the first
`sinks` positions and over the `recent + last` positions just before the queries, where recent = budget - sinks
is what a lazy layer keeps of the end; above `threshold` the layer is lazy and keeps its first `sinks` and last
`recent` tokens (the budget), else every token. The decision is per layer, so the cache holds the budget in lazy
layers and the whole prompt in the others: a budget sets what a lazy layer keeps, and the records (kv_bytes_after;
under a byte budget kv_budget_distance_bytes) count what all layers really hold. A prompt of at most budget +
2 x `last` tokens is kept whole, as the press does. The paper sets the threshold per model (Llama-3 0.9, Mistral
0.8, Qwen 0.85, Llama-2 0.65); 0.9 is its Llama-3 value, a threshold of 1 keeps everything (the press's default).
`last` = 1 and `sinks` = 4 are the press's and the paper's. Left out: the paper's decoding-time variant (the lazy
layers decided again from each new token) and its layer grouping.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.base import Method, param
from ..core.capabilities import Capability
from ..core.layer_inputs import LayerInputs
from .scoring import window_attention


@dataclass
class SimLayerKV(Method):
    name = "simlayerkv"
    paper = "Zhang et al. 2024, SimLayerKV (arXiv 2410.13846)"
    capabilities = Capability.COMPRESSES | Capability.KEEPS_LAYERS_WHOLE
    kvpress_press = "SimLayerKVPress"
    threshold: float = param(0.9, "attention share on sinks + recent tokens above which a layer is lazy (Llama-3: "
                                  "0.9; 1 keeps every layer whole)", minimum=0.0, maximum=1.0)
    last: int = param(1, "last prompt queries whose attention decides", minimum=1)
    sinks: int = param(4, "initial tokens a lazy layer keeps (attention sinks)", minimum=0)

    def is_lazy(self, layer: LayerInputs, n_keep: int) -> bool:
        """Whether the last queries put more than `threshold` of their attention on what a lazy layer keeps."""
        attention = window_attention(layer, self.last)[..., : layer.seq_len - self.last]  # keys before the queries
        share = attention.float().mean(dim=(0, 1, 2, 3))  # over the batch, every query head and the last queries
        recent = n_keep - min(self.sinks, n_keep) + self.last
        return float(share[: self.sinks].sum() + share[-recent:].sum()) > self.threshold

    def kept_indices(self, layer: LayerInputs, n_keep: int) -> torch.Tensor | None:
        T = layer.seq_len
        if self.threshold >= 1.0 or T <= n_keep + 2 * self.last or not self.is_lazy(layer, n_keep):
            return None
        sinks = min(self.sinks, n_keep)
        positions = torch.cat([torch.arange(sinks), torch.arange(T - (n_keep - sinks), T)]).to(layer.keys.device)
        batch, heads = layer.keys.shape[:2]
        return positions.expand(batch, heads, n_keep)
