"""leverage: keep the keys that are statistical outliers of their layer (approximate leverage scores).

Chari & Van Durme 2025, "Compactor: Calibrated Query-Agnostic KV Cache Compression with Approximate Leverage
Scores" (arXiv:2507.08143), the query-agnostic scorer kvpress ships as LeverageScorePress. Per KV head the
pre-RoPE keys are centred over the prompt and sketched on the right by a Gaussian matrix of `sketch_dimension`
columns (scaled by 1/sqrt(columns)); a token's score is its leverage in the sketch X, the diagonal of
X (X^T X)^-1 X^T, with X^T X made positive definite by a jitter (1e-2, tenfold on failure) and solved through its
Cholesky factor, in float32. The scores are z-normalised over the whole layer (every head). No observation
window: it suits the query_agnostic protocol. Default sketch_dimension=48 is LeverageScorePress's.

Pre-RoPE keys are the cached keys with the forward's RoPE undone (LayerInputs.keys_before_rope), so the scorer
needs the whole prompt in one forward: no chunked prefill, no cut-backs while decoding (Capability.PRE_ROPE_KEYS).
The sketch of layer l is the (l+1)-th draw of a CPU generator seeded `seed`, in the keys' dtype, as kvpress draws
it from torch's global generator layer after layer: after torch.manual_seed(seed) on a CPU the two sketches are
equal. Left out: Compactor's calibration of budgets across heads and its blend with attention-based scores
(kvpress's CompactorPress), and its non-causal chunked attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch

from ..core.kernel_memo import layer_kernel
from ..core.base import Method, param
from ..core.capabilities import SCORER, Capability
from ..core.layer_inputs import LayerInputs
from .scoring import score_dtype

JITTER, JITTER_TRIES = 1e-2, 5  # the first ridge on X^T X, and the tries (ridge x 10 each) before giving up


@lru_cache(maxsize=4)
def layer_sketches(seed: int, layers: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """[layers, *shape] the Gaussian sketches of every layer, drawn in order from one CPU generator."""
    return torch.randn(layers, *shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def cholesky_with_jitter(gram: torch.Tensor) -> torch.Tensor:
    """The lower Cholesky factor of gram + ridge x I, the ridge growing tenfold until it factors."""
    identity = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
    ridge = JITTER
    for _ in range(JITTER_TRIES):
        factor, info = torch.linalg.cholesky_ex(gram + ridge * identity)
        if not info.any():
            return factor
        ridge *= 10
    raise RuntimeError(f"leverage: X^T X did not factor with a ridge up to {ridge / 10:g}")


def leverage_scores(keys: torch.Tensor, sketch: torch.Tensor) -> torch.Tensor:
    """[batch, heads, T] float32 leverage of each centred key [batch, heads, T, dim] in its sketch keys @ sketch."""
    centred = keys - keys.mean(dim=-2, keepdim=True)
    sketched = (centred @ sketch.to(centred.dtype)).to(torch.float32)  # X [batch, heads, T, k]
    gram = sketched.transpose(-1, -2) @ sketched
    factor = cholesky_with_jitter((gram + gram.transpose(-1, -2)) / 2)
    solved = torch.cholesky_solve(sketched.transpose(-1, -2), factor)  # (X^T X)^-1 X^T [batch, heads, k, T]
    return (sketched * solved.transpose(-1, -2)).sum(dim=-1).clamp_min(0)


@dataclass
class Leverage(Method):
    name = "leverage"
    paper = "Chari & Van Durme 2025, Compactor (arXiv 2507.08143)"
    capabilities = SCORER | Capability.PRE_ROPE_KEYS
    kvpress_press = "LeverageScorePress"
    sketch_dimension: int = param(48, "columns of the Gaussian sketch of the keys", minimum=1)
    seed: int = param(0, "seed of the sketches (one generator, drawn layer after layer)", minimum=0)

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        return layer_leverage(layer, self.sketch_dimension, self.seed)


@layer_kernel
def layer_leverage(layer: LayerInputs, sketch_dimension: int, seed: int) -> torch.Tensor:
    """[batch, kv_heads, T] z-normalised leverage of the layer's pre-RoPE keys; independent of the budget, so the
    selections of a shared prefill compute it once per layer."""
    keys = layer.keys_before_rope()
    shape = (keys.shape[0], keys.shape[1], keys.shape[-1], sketch_dimension)
    sketch = layer_sketches(seed, layer.num_layers, shape, keys.dtype)[layer.layer_idx]
    sketch = sketch.to(keys.device) * (1 / math.sqrt(sketch_dimension))
    scores = leverage_scores(keys.to(score_dtype(keys)), sketch)
    return (scores - scores.mean()) / scores.std().clamp_min(1e-6)
