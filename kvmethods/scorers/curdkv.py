"""curdkv: keep the tokens whose keys and values carry the most leverage (value-guided CUR).

Sengupta et al. 2025, "Value-Guided KV Compression for LLMs via Approximated CUR Decomposition" (CurDKV,
arXiv:2509.15038). A CUR decomposition keeps the rows of the key and value matrices with the largest leverage
scores; CurDKV approximates a row's leverage by its squared norm (after a random Gaussian projection to 20
dimensions when `use_random_leverage`), normalised within windows of `local_window_size` tokens when
`use_local_approximation`. The key and value leverages are combined by `leverage_type` (their product by
default), normalised over the prompt, and the first `n_sink` tokens get 1 (kept ahead of any normalised score).
Attention-free: only the cached keys and values are read. Defaults are kvpress's CURPress's.

The random projection is drawn per (seed, layer) from a private generator (random.py's rule); CURPress draws it
from torch's global generator, so the two agree without it (the default) only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..core.base import Method, param
from ..core.capabilities import SCORER
from ..core.layer_inputs import LayerInputs
from .scoring import layer_generator, row_norms, score_dtype

LEVERAGE_TYPES = ("kv_product", "kv_avg", "key", "value")
SKETCH = 20  # the random projection's dimension (CurDKV's r)


def local_shares(rows: torch.Tensor, window: int) -> torch.Tensor:
    """Each entry of `rows` [batch, heads, T] over the sum of its window of `window` tokens (the last window
    shorter, padded with zeros)."""
    batch, heads, T = rows.shape
    padded = F.pad(rows, (0, -T % window)).view(batch, heads, -1, window)
    return (padded / padded.sum(dim=-1, keepdim=True)).view(batch, heads, -1)[..., :T]


@dataclass
class CurDKV(Method):
    name = "curdkv"
    paper = "Sengupta et al. 2025, CurDKV (arXiv 2509.15038)"
    capabilities = SCORER
    kvpress_press = "CURPress"
    kvpress_name = "cur"
    n_sink: int = param(4, "first tokens always kept (score 1)", minimum=0)
    leverage_type: str = param("kv_product", "how key and value leverages combine", choices=LEVERAGE_TYPES)
    use_random_leverage: bool = param(False, f"project keys and values to {SKETCH} random dimensions first")
    use_local_approximation: bool = param(True, "normalise leverages within windows of local_window_size tokens")
    local_window_size: int = param(16, "tokens per normalisation window", minimum=1)
    seed: int = param(0, "seed of the per-layer random projection (use_random_leverage)", minimum=0)

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        dtype = score_dtype(layer.keys)
        keys, values = layer.keys, layer.values
        if self.use_random_leverage:
            generator = layer_generator(self.seed, layer.layer_idx)
            sketch = torch.randn(keys.shape[-1], SKETCH, generator=generator, dtype=dtype) / math.sqrt(SKETCH)
            keys, values = (states.to(dtype) @ sketch.to(states.device) for states in (keys, values))
        k2, v2 = row_norms(keys).square(), row_norms(values).square()  # [batch, kv_heads, T]
        if self.use_local_approximation:
            k2, v2 = local_shares(k2, self.local_window_size), local_shares(v2, self.local_window_size)
        scores = {"key": k2, "value": v2, "kv_avg": (k2 + v2) / 2, "kv_product": k2 * v2}[self.leverage_type]
        scores = scores / scores.sum(dim=-1, keepdim=True)
        scores[..., :self.n_sink] = 1.0
        return scores
