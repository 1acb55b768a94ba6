"""criticalkv: a base method's scores rescaled by how much each value moves the layer's output.

Feng et al. 2025, "Identify Critical KV Cache in LLM Inference from an Output Perturbation Perspective"
(CriticalKV, arXiv:2502.03805). Evicting a token perturbs the attention output by its attention weight
times its value as projected through the output matrix, so the base score (attention, default snapkv)
is multiplied by ||v W_o^h||_1 (per query head, averaged over the heads sharing the KV head), after
adding `epsilon`. Two stages: the top `first_stage_ratio` of the budget is chosen by the base score
alone, the rest by the rescaled score. Defaults epsilon=1e-4 and first_stage_ratio=0.5 are the reference
code's (kvpress CriticalKVPress, reviewed by the paper's first author). The first stage keeps
max(1, int(first_stage_ratio x budget)) positions per head, kvpress' rounding. Under `adakv`
(`adakv:base=criticalkv`) the rescaled scores are shared among heads; kvpress' CriticalAdaKVPress
instead splits each head's adaptive budget into the two stages, so the two may differ at the margin.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.base import param
from ..core.capabilities import Capability, SCORER
from ..core.errors import MethodError
from ..core.kernel_memo import layer_kernel
from ..core.layer_inputs import LayerInputs
from ..core.precision import score_dtype
from .score_wrapper import WrapperMethod


@layer_kernel
def output_projected_value_norms(layer: LayerInputs) -> torch.Tensor:
    """[batch, kv_heads, T]: ||v W_o^h||_1 of each cached value, averaged over the query heads h of the
    KV head. One query head at a time, so the scratch is T x hidden."""
    module, values = layer.module, layer.values
    dtype = score_dtype(values)
    weight = module.o_proj.weight.to(dtype)  # [hidden, q_heads * head_dim]
    groups, head_dim = layer.num_groups, values.shape[-1]  # values may be narrower than keys (MLA)
    norms = torch.empty(*values.shape[:3], dtype=dtype, device=values.device)
    for kv_head in range(layer.num_kv_heads):
        per_query_head = []
        for q_head in range(kv_head * groups, (kv_head + 1) * groups):
            projection = weight[:, q_head * head_dim:(q_head + 1) * head_dim]  # [hidden, head_dim]
            per_query_head.append((values[:, kv_head].to(dtype) @ projection.T).abs().sum(dim=-1))
        norms[:, kv_head] = torch.stack(per_query_head).mean(dim=0)
    return norms


@dataclass
class CriticalKV(WrapperMethod):
    name = "criticalkv"
    paper = "Feng et al. 2025, CriticalKV (arXiv 2502.03805)"
    capabilities = SCORER | Capability.WRAPS
    kvpress_press = "CriticalKVPress"
    base: str = param("snapkv", "method whose scores are rescaled (any method with score())")
    epsilon: float = param(1e-4, "added to the base score before rescaling", minimum=0.0)
    first_stage_ratio: float = param(0.5, "share of the budget chosen by the base score alone", minimum=0.0)

    def check(self) -> None:
        if self.first_stage_ratio > 1:
            raise MethodError(f"{self.name}: parameter 'first_stage_ratio' must be in [0, 1], got {self.first_stage_ratio}")

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        base = self.inner.score(layer, n_keep)
        first_stage = max(1, int(n_keep * self.first_stage_ratio)) if self.first_stage_ratio > 0 else 0
        chosen = base.topk(first_stage, dim=-1).indices
        scores = (base.to(score_dtype(layer.values)) + self.epsilon) * output_projected_value_norms(layer)
        return scores.scatter_(-1, chosen, float("inf"))
