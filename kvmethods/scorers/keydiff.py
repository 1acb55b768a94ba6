"""keydiff: keep the keys least similar to the layer's mean key direction.

Park et al. 2025, "KeyDiff: Key Similarity-Based KV Cache Eviction for Long-Context LLM Inference in
Resource-Constrained Environments" (arXiv:2504.15364): geometrically distinctive keys tend to draw high
attention, so a key's score is its negative cosine similarity to an anchor, the mean of the layer's unit-norm
keys (per KV head). Attention-free, like knorm; the cached (post-RoPE) keys are scored, as kvpress' KeyDiffPress
does. The paper evicts block by block while the prompt streams in; that iteration is the chunked prefill's job
here (`keydiff:prefill_chunk=N`), not this scorer's. No parameters: KeyDiffPress has none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.base import Method
from ..core.capabilities import SCORER
from ..core.layer_inputs import LayerInputs
from .scoring import score_dtype

UNIT_EPS, COSINE_EPS = 1e-12, 1e-8  # torch's F.normalize and F.cosine_similarity floors, which KeyDiffPress uses


@dataclass
class KeyDiff(Method):
    name = "keydiff"
    paper = "Park et al. 2025, KeyDiff (arXiv 2504.15364)"
    capabilities = SCORER
    kvpress_press = "KeyDiffPress"
    kvpress_name = "keydiff"

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        keys = layer.keys.to(score_dtype(layer.keys))  # [batch, kv_heads, T, dim]
        norms = torch.linalg.vector_norm(keys, dim=-1)  # [batch, kv_heads, T]
        # the anchor: the mean of the unit keys, as one product (no normalised copy of the keys)
        anchor = (norms.clamp_min(UNIT_EPS).reciprocal().unsqueeze(-2) @ keys) / layer.seq_len  # [.., 1, dim]
        cosines = (keys @ anchor.transpose(-1, -2)).squeeze(-1)
        # cosine similarity as torch's: each norm floored at COSINE_EPS
        anchor_norm = torch.linalg.vector_norm(anchor, dim=-1).clamp_min(COSINE_EPS)
        return -cosines / (norms.clamp_min(COSINE_EPS) * anchor_norm)
