"""merge: evict by a base method's scores, but fold each evicted value into its most similar kept neighbour.

Token merging on eviction, as kvpress' MergingPress does it, after Token Merging (Bolya et al. 2023, arXiv
2210.09461) and D2O (Wan et al. 2024, arXiv 2406.13035). The base (any method with score(), default snapkv)
chooses the kept positions per KV head exactly as it does alone. Then each evicted token finds the kept key most
similar to its own (cosine); when that similarity is at least `similarity_threshold`, and among the top
`merge_fraction` of the evicted tokens by similarity (a quantile over the head's evicted tokens), its value is
merged into the target's with the weight w = max(sim, 0) x |v_e| / (|v_e| + |v_t| + 1e-6):
v_t <- (v_t + sum w v_e) / (1 + sum w). Keys are kept as they are, so RoPE positions stay exact, and the number
of kept tokens (hence the bytes) is the base's. The defaults (0.0 and 1.0) are MergingPress's; its docstring
reports 1.0 best on retrieval and 0.75 on extraction. Similarities and the merge run in float32, the result is
stored at the cache's dtype, as MergingPress does. Two kept keys exactly as similar to an evicted one: the first
kept in position order takes it (MergingPress: the first in its top-k order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.base import param
from ..core.capabilities import Capability
from ..core.errors import MethodError
from ..core.layer_inputs import LayerInputs
from .score_wrapper import WrapperMethod

EPS = 1e-6  # MergingPress's: norms clamped, the weights' denominator
ROWS = 4096  # evicted tokens compared with the kept keys at once: bounds the similarity matrix


def nearest_kept(evicted_keys: torch.Tensor, kept_keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(similarity, index) of the most cosine-similar kept key [batch, heads, n_evicted] for each evicted key, in
    float32, ROWS evicted keys at a time."""
    kept = kept_keys.float()
    kept = kept / kept.norm(dim=-1, keepdim=True).clamp(min=EPS)
    best, target = [], []
    for rows in evicted_keys.split(ROWS, dim=2):
        rows = rows.float()
        rows = rows / rows.norm(dim=-1, keepdim=True).clamp(min=EPS)
        similarity, index = (rows @ kept.transpose(-2, -1)).max(dim=-1)
        best.append(similarity)
        target.append(index)
    return torch.cat(best, dim=2), torch.cat(target, dim=2)


@dataclass
class Merge(WrapperMethod):
    name = "merge"
    paper = "kvpress MergingPress, after Bolya et al. 2023, ToMe (arXiv 2210.09461) and Wan et al. 2024, D2O " \
            "(arXiv 2406.13035)"
    capabilities = Capability.COMPRESSES | Capability.WRAPS | Capability.MERGES_VALUES
    kvpress_press = "MergingPress"
    base: str = param("snapkv", "method whose scores choose the kept tokens (any method with score())")
    similarity_threshold: float = param(0.0, "least cosine similarity of an evicted key to its target for a merge",
                                        minimum=0.0, maximum=1.0)
    merge_fraction: float = param(1.0, "share of the evicted tokens merged, the most similar first (in (0, 1])",
                                  minimum=0.0, maximum=1.0)

    def check(self) -> None:
        if self.merge_fraction <= 0:
            raise MethodError(f"{self.name}: parameter 'merge_fraction' must be in (0, 1], got {self.merge_fraction}")

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        return self.inner.score(layer, n_keep)

    def kept_values(self, keys: torch.Tensor, values: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        batch, heads, length, dim = values.shape
        kept_rows = values.gather(2, kept.unsqueeze(-1).expand(-1, -1, -1, dim))
        if kept.shape[-1] in (0, length):
            return kept_rows
        evicted_mask = torch.ones(batch, heads, length, dtype=torch.bool, device=keys.device)
        evicted_mask.scatter_(2, kept, False)
        evicted = evicted_mask.nonzero()[:, 2].view(batch, heads, length - kept.shape[-1])
        evicted_keys = keys.gather(2, evicted.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1]))
        kept_keys = keys.gather(2, kept.unsqueeze(-1).expand(-1, -1, -1, keys.shape[-1]))
        evicted_values = values.gather(2, evicted.unsqueeze(-1).expand(-1, -1, -1, dim)).float()
        similarity, target = nearest_kept(evicted_keys, kept_keys)
        merges = similarity >= self.similarity_threshold
        if self.merge_fraction < 1.0 and bool(merges.any()):  # the most similar merge_fraction of the evicted
            floor = similarity.masked_fill(~merges, float("-inf")).quantile(1.0 - self.merge_fraction, dim=-1,
                                                                             keepdim=True)
            merges &= similarity >= floor
        evicted_norm = evicted_values.norm(dim=-1)
        target_norm = kept_rows.float().norm(dim=-1).gather(2, target)
        weights = similarity.clamp(min=0) * merges.float() * evicted_norm / (evicted_norm + target_norm + EPS)
        folded = torch.zeros(batch, heads, kept.shape[-1], dim, dtype=torch.float32, device=values.device)
        folded.scatter_add_(2, target.unsqueeze(-1).expand(-1, -1, -1, dim), weights.unsqueeze(-1) * evicted_values)
        total = torch.zeros(batch, heads, kept.shape[-1], dtype=torch.float32, device=values.device)
        total.scatter_add_(2, target, weights)
        merged = ((kept_rows.float() + folded) / (1.0 + total).unsqueeze(-1)).to(values.dtype)
        return torch.where((total > 0).unsqueeze(-1), merged, kept_rows)
