"""h2o: heavy hitters (attention accumulated over all prompt queries) plus a recent window.

Zhang et al. 2023, "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language
Models" (arXiv:2306.14048). A key's score is the softmax attention it receives summed over every prompt
query (causal), averaged over the query heads sharing its KV head. The paper splits the cache equally
between heavy hitters and recent tokens (heavy_ratio = recent_ratio in the reference code), hence
recent_ratio=0.5: the last half of the budget is the recent window, the rest the top-scoring earlier keys.
Scores come from `accumulated_attention`, in query chunks: no eager attention, no T x T matrix.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.base import Method, param
from ..core.capabilities import Capability, SCORER
from ..core.layer_inputs import LayerInputs
from .scoring import accumulated_attention, protect_last


@dataclass
class H2O(Method):
    name = "h2o"
    paper = "Zhang et al. 2023, H2O (arXiv 2306.14048)"
    capabilities = SCORER | Capability.NEEDS_ALL_QUERIES
    kvcache_factory_name = "H2O"
    recent_ratio: float = param(0.5, "fraction of the budget given to the most recent tokens", minimum=0.0,
                                maximum=1.0)

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        return protect_last(accumulated_attention(layer), int(n_keep * self.recent_ratio))
