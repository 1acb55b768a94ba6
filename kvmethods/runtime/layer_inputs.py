"""What a method sees of one decoder layer at the end of the compressed prefill.

The forward hook on the layer's attention module collects these from public places only: the hook
kwargs (hidden_states, position_embeddings) and the DynamicCache layer (keys/values, after RoPE, one row
per KV head). Queries are not kept by the model, so methods that need attention recompute the few they
need with the module's own q_proj (and q_norm, as in Qwen3) and the standard rotate-half RoPE; during
the compressed prefill a forward hook on q_proj hands over its output, so only norm and RoPE are redone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..attention.kernel_memo import KernelMemo


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass
class LayerInputs:
    module: nn.Module  # the decoder layer's self-attention module
    layer_idx: int
    num_layers: int
    hidden_states: torch.Tensor  # [batch, T, hidden], the attention input (after the input norm)
    cos: torch.Tensor  # [batch, T, head_dim]
    sin: torch.Tensor  # [batch, T, head_dim]
    keys: torch.Tensor  # [batch, num_kv_heads, T, head_dim], RoPE applied
    values: torch.Tensor  # [batch, num_kv_heads, T, head_dim]
    projected_queries: torch.Tensor | None = None  # [batch, T, q_heads * head_dim], q_proj output if captured
    rotary: nn.Module | None = None  # the decoder's rotary_emb: cos/sin at any position (rope_at)
    memo: KernelMemo | None = None  # kernels shared with the other selections of a shared prefill

    @property
    def seq_len(self) -> int:
        return self.keys.shape[-2]

    @property
    def num_kv_heads(self) -> int:
        return self.keys.shape[1]

    @property
    def head_dim(self) -> int:
        return self.keys.shape[-1]

    @property
    def num_groups(self) -> int:
        """Query heads per KV head (1 without GQA)."""
        return self.module.config.num_attention_heads // self.num_kv_heads

    @property
    def scaling(self) -> float:
        return float(getattr(self.module, "scaling", self.head_dim**-0.5))

    def queries(self, last: int | None = None, *, rope: bool = True) -> torch.Tensor:
        """[batch, num_q_heads, n, head_dim] queries of the last `last` positions (all if None), RoPE'd
        at their positions unless rope=False (pre-RoPE, after Qwen3's q_norm)."""
        n = self.hidden_states.shape[1] if last is None else last
        if self.projected_queries is not None:
            projected = self.projected_queries[:, -n:]
        else:
            projected = self.module.q_proj(self.hidden_states[:, -n:])
        batch = projected.shape[0]
        q = projected.view(batch, n, -1, self.head_dim)
        q_norm = getattr(self.module, "q_norm", None)
        if q_norm is not None:
            q = q_norm(q)
        q = q.transpose(1, 2)
        if not rope:
            return q
        cos = self.cos[:, -n:].unsqueeze(1)
        sin = self.sin[:, -n:].unsqueeze(1)
        return q * cos + _rotate_half(q) * sin

    def rope_at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [n, head_dim] of the model's RoPE at the given positions (e.g. future ones)."""
        if self.rotary is None:
            raise ValueError("LayerInputs.rotary is not set: the model has no decoder rotary_emb")
        cos, sin = self.rotary(self.keys, positions.unsqueeze(0).to(self.keys.device))
        return cos[0], sin[0]
