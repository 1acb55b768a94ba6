"""pyramidkv: SnapKV selection with pyramidal per-layer budgets (more in lower layers).

Cai et al. 2024, "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information Funneling"
(arXiv:2406.02069). Lower layers spread attention widely, upper layers focus, so the non-window budget
B = budget - window decreases linearly from 2B - B/beta (layer 0) to B/beta (last layer); when the top
exceeds the prompt it is capped and the bottom raised to keep the total (KVCache-Factory's rule). Unlike
KVCache-Factory's integer step, the schedule is rounded so that the per-layer budgets average exactly to
the budget, which is what the comparison tables assume. beta=20 is KVCache-Factory's default; window,
kernel and pooling default as in SnapKV.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..core.base import param
from ..core.capabilities import SCORER
from .snapkv import SnapKV


def pyramid_schedule(extra: int, num_layers: int, beta: float, cap: int) -> list[int]:
    """Per-layer counts, linearly decreasing, each <= cap, summing exactly to extra * num_layers."""
    if num_layers == 1:
        return [extra]
    low = extra / beta
    high = 2 * extra - low
    if high > cap:
        high, low = cap, 2 * extra - cap
    exact = [high - (high - low) * i / (num_layers - 1) for i in range(num_layers)]
    counts = [math.floor(x) for x in exact]
    shortfall = extra * num_layers - sum(counts)
    by_fraction = sorted(range(num_layers), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in by_fraction[:shortfall]:
        counts[i] += 1
    return counts


@dataclass
class PyramidKV(SnapKV):
    name = "pyramidkv"
    paper = "Cai et al. 2024, PyramidKV (arXiv 2406.02069)"
    capabilities = SCORER
    kvpress_press = "PyramidKVPress"
    kvpress_name = "pyramidkv"
    kvcache_factory_name = "PyramidKV"
    beta: float = param(20.0, "ratio between the average and the top-layer budget (beyond the window)", minimum=1.0)

    def layer_budgets(self, budget_tokens: int, num_layers: int, prompt_len: int) -> list[int]:
        if budget_tokens >= prompt_len:
            return [prompt_len] * num_layers
        window = min(self.window, budget_tokens)
        counts = pyramid_schedule(budget_tokens - window, num_layers, self.beta, prompt_len - window)
        return [window + count for count in counts]
