"""rkv: redundancy-aware compression of reasoning traces, while decoding.

Cai et al. 2025, "R-KV: Redundancy-aware KV Cache Compression for Reasoning Models" (arXiv 2505.24133).
Long chains of thought repeat themselves, so attention alone keeps many near-copies. Each position gets
  mix_lambda * importance - (1 - mix_lambda) * redundancy:
importance is the SnapKV-style attention of the last `window` queries, max-pooled along positions with
`kernel`; redundancy is the key's mean cosine similarity to the other keys of its head (the similarity to
its most recent near-copy above `threshold` is not counted, so the latest copy survives), softmax-normalised
over positions. The window is always kept. It compresses while decoding (decoding_compression.py) every
`interval` new tokens, as well as at prefill. Defaults window=8, kernel=7, mix_lambda=0.07, interval=128
(the reference's buffer) are the reference code's (Zefan-Cai/R-KV, rkv/compression/r1_kv.py); threshold=0.5
is the redundancy threshold of kvpress' port of R-KV.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.base import Method, param
from ..core.capabilities import Capability, SCORER
from .decoding_compression import check_decoding_scorer, compressing_decode
from ..core.errors import MethodError
from ..core.layer_inputs import LayerInputs
from ..core.precision import score_dtype
from ..scorers.scoring import pool_positions, protect_last, window_attention


def key_redundancy(keys: torch.Tensor, threshold: float) -> torch.Tensor:
    """[batch, kv_heads, T]: per head, each key's mean cosine similarity to the others, without its
    most recent near-copy (similarity > threshold), softmax-normalised over positions."""
    unit = keys.to(score_dtype(keys))
    unit = unit / (unit.norm(dim=-1, keepdim=True) + 1e-8)
    similarity = unit @ unit.transpose(-1, -2)  # [batch, kv_heads, T, T]
    similarity.diagonal(dim1=-2, dim2=-1).zero_()
    positions = torch.arange(similarity.shape[-1], device=keys.device)
    latest_copy = torch.where(similarity > threshold, positions, 0).amax(dim=-1, keepdim=True)
    similarity.scatter_(-1, latest_copy, 0.0)
    return similarity.mean(dim=-1).softmax(dim=-1)


@dataclass
class RKV(Method):
    name = "rkv"
    paper = "Cai et al. 2025, R-KV (arXiv 2505.24133)"
    capabilities = SCORER | Capability.COMPRESSES_WHILE_DECODING
    window: int = param(8, "recent queries that vote (and are always kept)", minimum=1)
    kernel: int = param(7, "max-pooling kernel along positions", minimum=1)
    mix_lambda: float = param(0.07, "weight of importance against redundancy", minimum=0.0)
    threshold: float = param(0.5, "cosine similarity above which two keys are near-copies")
    interval: int = param(128, "new tokens between two compressions while decoding", minimum=1)

    def check(self) -> None:
        if self.kernel % 2 == 0:
            raise MethodError(f"{self.name}: parameter 'kernel' must be odd, got {self.kernel}")
        if self.mix_lambda > 1:
            raise MethodError(f"{self.name}: parameter 'mix_lambda' must be in [0, 1], got {self.mix_lambda}")
        check_decoding_scorer(self.name, self, self.interval)

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        window = min(self.window, n_keep, layer.seq_len)
        importance = window_attention(layer, window).mean(dim=3).mean(dim=2)  # [batch, kv_heads, T]
        importance = pool_positions(importance, self.kernel, "maxpool")
        scores = self.mix_lambda * importance - (1 - self.mix_lambda) * key_redundancy(layer.keys, self.threshold)
        return protect_last(scores, window)

    def while_decoding(self, model, state):
        return compressing_decode(model, state, self, self.interval)
