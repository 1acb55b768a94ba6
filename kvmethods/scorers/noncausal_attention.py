"""noncausal_attention: attention each key receives from every prompt query within its chunk, both directions.

Chari & Van Durme 2025, "Compactor: Calibrated Query-Agnostic KV Cache Compression with Approximate Leverage
Scores" (arXiv 2507.08143), its attention-side score, as kvpress's NonCausalAttnPress computes it: the prompt
cut into chunks of `chunk_size` tokens (the last one padded with zero queries and keys), each query attending to
every key of its own chunk, earlier and later (no causal mask, no 1/sqrt(d) scale: the press's logits are the
plain dot products), the softmax summed over the chunk's queries (the zero-padded queries included: each adds
a uniform 1/chunk_size to its chunk's keys), averaged over the query heads of a KV head, times the value's L2
norm, then averaged over each position and its two neighbours (zero beyond the ends). The press's final z-score
is one increasing map of every score, so it keeps the same positions and is left out. Learned sink logits
(gpt-oss) are not in the press's softmax, nor here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..core.base import Method, param
from ..core.capabilities import Capability, SCORER
from ..core.layer_inputs import LayerInputs
from ..core.precision import score_dtype


@dataclass
class NonCausalAttention(Method):
    name = "noncausal_attention"
    paper = "Chari & Van Durme 2025, Compactor (arXiv 2507.08143)"
    capabilities = SCORER | Capability.NEEDS_ALL_QUERIES
    kvpress_press = "NonCausalAttnPress"
    kvpress_defaults = "chunk_size=256"
    chunk_size: int = param(256, "tokens per chunk; each query attends to every key of its chunk", minimum=1)

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        dtype = score_dtype(layer.keys)
        queries = layer.queries(None)  # [batch, q_heads, T, dim], RoPE'd
        batch, _, length, dim = queries.shape
        kv_heads, groups, size = layer.num_kv_heads, layer.num_groups, self.chunk_size
        chunks = -(-length // size)
        pad = (0, 0, 0, chunks * size - length)  # zero queries and keys after the prompt
        q = F.pad(queries, pad).view(batch, kv_heads, groups, chunks, size, dim)
        k = F.pad(layer.keys.to(queries.dtype), pad).view(batch, kv_heads, 1, chunks, size, dim)
        attention = torch.softmax((q @ k.transpose(-1, -2)).to(dtype), dim=-1)  # [.., chunks, queries, keys]
        received = attention.sum(dim=-2).mean(dim=2).reshape(batch, kv_heads, chunks * size)[..., :length]
        scores = received * layer.values.to(dtype).norm(dim=-1)
        return F.avg_pool1d(scores, kernel_size=3, stride=1, padding=1)
