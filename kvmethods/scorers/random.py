"""random: keep uniformly random positions per KV head, the floor any method must beat.

The usual sanity baseline (kvpress' RandomPress). Seeded per (seed, layer) with a private generator so
that runs are reproducible and do not disturb the global RNG.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.base import Method, param
from ..core.capabilities import SCORER
from ..core.layer_inputs import LayerInputs
from .scoring import layer_generator


@dataclass
class Random(Method):
    name = "random"
    paper = "baseline (kvpress RandomPress)"
    capabilities = SCORER
    kvpress_press = "RandomPress:seed=0"
    kvpress_name = "random"
    kvcache_factory_name = "random"
    seed: int = param(0, "seed of the per-layer generator", minimum=0)

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        generator = layer_generator(self.seed, layer.layer_idx)
        batch, heads, T = layer.keys.shape[:3]
        return torch.rand(batch, heads, T, generator=generator).to(layer.keys.device)
