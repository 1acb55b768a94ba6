"""tova: keep what the last prompt token attends to.

Oren et al. 2024, "Transformers are Multi-State RNNs" (TOVA, arXiv:2401.06104): the current query's
attention, averaged over all heads of the layer, ranks the cached tokens; the lowest are dropped. At
prefill this is the last prompt token's attention; all KV heads keep the same positions (the paper's
head-averaged policy, as in kvpress' TOVAPress). The last token itself is always kept, as kvpress does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.base import Method
from ..core.capabilities import SCORER
from ..core.layer_inputs import LayerInputs
from .scoring import protect_last, window_attention


@dataclass
class TOVA(Method):
    name = "tova"
    paper = "Oren et al. 2024, TOVA (arXiv 2401.06104)"
    capabilities = SCORER
    kvpress_press = "TOVAPress"
    kvpress_name = "tova"

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        last_row = window_attention(layer, 1)[:, :, :, 0]  # [batch, kv_heads, G, T]
        averaged = last_row.mean(dim=(1, 2), keepdim=True).squeeze(2)  # [batch, 1, T]
        scores = averaged.expand(-1, layer.num_kv_heads, -1).clone()
        return protect_last(scores, 1)
