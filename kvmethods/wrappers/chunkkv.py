"""chunkkv: keep whole chunks of consecutive tokens, ranked by a base method's scores.

Liu et al. 2025, "ChunkKV: Semantic-Preserving KV Cache Compression for Efficient Long-Context LLM Inference"
(arXiv 2502.00299). Evicting tokens one by one breaks phrases apart; ChunkKV cuts the prompt into chunks of
`chunk_length` consecutive tokens and keeps or drops each chunk whole. A chunk's score is its base scores (any
method with score(), default snapkv) summed over the layer's KV heads and averaged over its positions, the last,
shorter chunk over its own positions, as kvpress' ChunkKVPress does; every KV head of a layer keeps the same
chunks. The paper's chunk size is 10 (its ablation over 1 to 30); kvpress' default is 20.

The budget counts tokens, so the chunks are taken best first until the budget is spent and the last one taken is
cut to its earliest positions (ties go to the earlier position). kvpress keeps max(1, int(chunks x (1 - ratio)))
whole chunks instead, which equals the budget when the budget is a whole number of chunks (the agreement tests use
such budgets). A base's protected positions (snapkv's window, +inf) protect their whole chunk; kvpress' SnapKVPress
gives its window the maximum score + 1, so a chunk straddling the window may lose to another there. A prompt shorter
than one chunk is scored by the base alone, as kvpress delegates it. Left out: the paper's layer-wise index reuse
(adjacent layers sharing one selection), an efficiency option kvpress does not have either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.base import param
from ..core.capabilities import SCORER, Capability
from ..core.layer_inputs import LayerInputs
from .score_wrapper import WrapperMethod


def chunk_scores(scores: torch.Tensor, chunk_length: int) -> torch.Tensor:
    """[batch, heads, T]: each position scored by its chunk's mean over positions of the sum over heads."""
    batch, heads, length = scores.shape
    summed = scores.sum(dim=1)  # [batch, T]
    whole = length // chunk_length * chunk_length
    means = [summed[:, :whole].view(batch, -1, chunk_length).mean(dim=-1).repeat_interleave(chunk_length, dim=-1)]
    if whole < length:  # the last, shorter chunk
        means.append(summed[:, whole:].mean(dim=-1, keepdim=True).expand(-1, length - whole))
    return torch.cat(means, dim=-1).unsqueeze(1).expand(batch, heads, length).contiguous()


@dataclass
class ChunkKV(WrapperMethod):
    name = "chunkkv"
    paper = "Liu et al. 2025, ChunkKV (arXiv 2502.00299)"
    capabilities = SCORER | Capability.WRAPS
    kvpress_press = "ChunkKVPress"
    kvpress_defaults = "chunk_length=20"
    base: str = param("snapkv", "method whose scores rank the chunks (any method with score())")
    chunk_length: int = param(10, "consecutive tokens kept or dropped together (the paper's chunk size)", minimum=1)

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        base = self.inner.score(layer, n_keep)
        if base.shape[-1] < self.chunk_length:
            return base
        return chunk_scores(base, self.chunk_length)
