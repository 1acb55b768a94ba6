"""adakv: one layer budget shared among its KV heads by their scores (head-adaptive, stored ragged).

Feng et al. 2024, "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for Efficient LLM
Inference" (arXiv:2407.11550). Any scoring method (`base`, default snapkv: the paper's Ada-SnapKV) scores
every prompt position of every KV head; instead of the top `budget` of each head, the layer keeps the top
`budget x num_kv_heads` over all heads at once, so heads that concentrate their attention give budget to
heads that spread it. The safeguard floor keeps each head's own top `max(1, int(alpha x budget))` first;
alpha = 0.2 is the AdaKV reference code's `floor_alpha` (also kvpress' `alpha_safeguard`). Like kvpress,
the floor counts from the whole per-head budget (a base's protected window included), and the base's
per-layer budgets (pyramidkv) are kept. Ties in the shared top-k go to the lower head, then the earlier
position, so equal scores in every head give exactly the base method's selection, and so does alpha = 1
(nothing left to share). FFY0/AdaKV's own code differs in the floor: it leaves the window out and blends each
head's share of the shared top-k with a uniform floor, round(share x (1 - alpha) + alpha x (budget - window))
non-window tokens. docs/adakv.md: why adakv scores below snapkv on SmolLM2-135M's needles (the allocation,
not the ragged cache).

With `across_layers` (bases that score the whole prompt: kvzip) the top-k also runs over all layers, as in
KVzipPress's default: layers then keep different totals too.

Heads then keep different numbers of tokens: the cache is stored per head (ragged.RaggedLayer), so its
bytes follow the sum of kept tokens, and records show each head's count.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.base import Method, param, top_positions
from ..core.capabilities import Capability
from ..core.errors import MethodError
from .score_wrapper import WrapperMethod


def head_adaptive_mask(scores: torch.Tensor, n_keep: int, alpha: float) -> torch.Tensor:
    """bool [..., heads, T]: the top (number of heads in scores) * n_keep positions over all leading axes
    but the first (batch), with at least the floor max(1, int(alpha * n_keep)) in every head."""
    batch, T = scores.shape[0], scores.shape[-1]
    floor = max(1, int(n_keep * alpha)) if alpha > 0 else 0
    ranked = scores.clone()
    if floor:
        guaranteed = top_positions(scores, floor)
        ranked.scatter_(-1, guaranteed, float("inf"))
    order = torch.sort(ranked.reshape(batch, -1), dim=-1, descending=True, stable=True).indices
    mask = torch.zeros(batch, ranked[0].numel(), dtype=torch.bool, device=scores.device)
    mask.scatter_(-1, order[:, : ranked[0].numel() // T * n_keep], True)
    return mask.view(scores.shape)


@dataclass
class AdaKV(WrapperMethod):
    name = "adakv"
    paper = "Feng et al. 2024, Ada-KV (arXiv 2407.11550)"
    capabilities = Capability.COMPRESSES | Capability.HEAD_ADAPTIVE | Capability.WRAPS
    kvpress_press = "AdaKVPress"
    kvcache_factory_name = "AdaKV"
    base: str = param("snapkv", "scoring method whose scores the heads share (any method with score())")
    alpha: float = param(0.2, "safeguard floor: each head keeps at least alpha x budget of its own top tokens",
                         minimum=0.0)
    across_layers: bool = param(False, "share the budget over all layers too (bases scoring the whole prompt: "
                                       "kvzip; KVzipPress's default)")

    def check(self) -> None:
        if self.alpha > 1:
            raise MethodError(f"{self.name}: parameter 'alpha' must be in [0, 1], got {self.alpha}")

    def check_base(self) -> None:
        if self.across_layers and Capability.SCORES_WHOLE_PROMPT not in self.inner.capabilities:
            raise MethodError(f"{self.name}: across_layers needs a base that scores the whole prompt at once (kvzip), "
                              f"not {self.base!r}")

    def inherited(self, inner: Method) -> Capability:
        """adakv over kvzip scores after the prefill, like kvzip; across_layers shares the budget over layers."""
        shared = Capability.SHARES_ACROSS_LAYERS if self.across_layers else Capability(0)
        return super().inherited(inner) | shared

    def select_layers(self, scores: list[torch.Tensor], layer_budgets: list[int]) -> list[torch.Tensor]:
        if not self.across_layers:
            return super().select_layers(scores, layer_budgets)
        # one top-k over every layer and head: the mean budget per layer, times layers and heads
        n_keep = sum(layer_budgets) // len(layer_budgets)
        return list(head_adaptive_mask(torch.stack(scores, dim=1), n_keep, self.alpha).unbind(dim=1))

    def can_wrap(self, inner: Method) -> bool:
        return (Capability.COMPRESSES in inner.capabilities
                and bool(inner.capabilities & (Capability.LAYER_SCORES | Capability.SCORES_WHOLE_PROMPT)))

    def prefill_scores(self, model, cache, input_ids):
        return self.inner.prefill_scores(model, cache, input_ids)

    def select(self, scores: torch.Tensor, n_keep: int) -> torch.Tensor:
        return head_adaptive_mask(scores, n_keep, self.alpha)
