"""knorm: keep the keys with the lowest L2 norm.

Devoto et al. 2024, "A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression"
(arXiv:2406.11430): low key norm correlates with high attention, so the norm is a free, attention-free
score. Per KV head; RoPE is a rotation, so the post-RoPE cached keys have the same norms.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.base import Method
from ..core.capabilities import SCORER
from ..core.layer_inputs import LayerInputs
from ..core.precision import score_dtype


@dataclass
class KNorm(Method):
    name = "knorm"
    paper = "Devoto et al. 2024, L2 norm-based KV cache compression (arXiv 2406.11430)"
    capabilities = SCORER
    kvpress_press = "KnormPress"
    kvpress_name = "knorm"
    kvcache_factory_name = "L2Norm"

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        return -layer.keys.to(score_dtype(layer.keys)).norm(dim=-1)
