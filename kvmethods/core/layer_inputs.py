"""What a method sees of one decoder layer at the end of the compressed prefill.

The forward hook on the layer's attention module collects these from public places only: the hook
kwargs (hidden_states, position_embeddings) and the DynamicCache layer (keys/values, after RoPE, one row
per KV head). Queries are not kept by the model, so methods that need attention recompute the few they
need with the module's own q_proj (and q_norm, as in Qwen3) and the standard rotate-half RoPE; during
the compressed prefill a forward hook on q_proj hands over its output, so only norm and RoPE are redone.
Where the family's description (kvmethods/core/layout.py) says the layer's queries cannot be redone that
way, they are the ones the attention call received (`captured_queries`, RoPE'd); where it says the layer
has no RoPE, queries are never rotated, and `rope_at` is the identity. Learned sink logits (gpt-oss) are
read from the module attribute the description names.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .kernel_memo import KernelMemo
from .errors import MethodError
from .layout import PROJECTION, LayerLayout


def rotate_half(x: torch.Tensor) -> torch.Tensor:
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
    captured_queries: torch.Tensor | None = None  # [batch, q_heads, T, head_dim] RoPE'd, from the attention call
    layout: LayerLayout | None = None  # what the family's description says of this layer (None: plain)
    # The position of the token after the keys (where future queries start); None: seq_len, the keys being the
    # prompt's positions 0..T-1. A compressed sliding window's keys sit at the prompt's end
    # (attention/prefill_compression.window_inputs).
    next_position: int | None = None

    @property
    def seq_len(self) -> int:
        return self.keys.shape[-2]

    @property
    def future_start(self) -> int:
        """The first position after the keys (what methods rotating queries to future positions start at)."""
        return self.seq_len if self.next_position is None else self.next_position

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
        if self.captured_queries is not None:
            if not rope and self.rotates:
                raise MethodError(f"layer {self.layer_idx}: pre-RoPE queries cannot be recomputed for this family "
                                  f"(its attention computes them otherwise)")
            return self.captured_queries[:, :, -n:]
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
        if not rope or not self.rotates:
            return q
        cos = self.cos[:, -n:].unsqueeze(1)
        sin = self.sin[:, -n:].unsqueeze(1)
        return q * cos + rotate_half(q) * sin

    def keys_before_rope(self) -> torch.Tensor:
        """[batch, num_kv_heads, T, head_dim] the cached keys with the forward's rotate-half RoPE undone (after
        Qwen3's k_norm, as k_proj + k_norm give them): the keys must be the forward's own T positions, and the
        family's description must say its layers rotate that way (refusal(): PRE_ROPE_KEYS)."""
        if not self.rotates:
            return self.keys
        if self.layout is not None and self.layout.queries != PROJECTION:
            raise MethodError(f"layer {self.layer_idx}: pre-RoPE keys cannot be recovered for this family "
                              f"(its attention rotates them otherwise)")
        if self.cos.shape[1] != self.seq_len:
            raise MethodError(f"layer {self.layer_idx}: pre-RoPE keys need the forward's positions of all "
                              f"{self.seq_len} keys, and it had {self.cos.shape[1]}")
        # each pair of channels was turned by [[cos, -sin], [sin, cos]]: undone by its inverse, over cos^2 + sin^2
        # (not exactly 1: the model's cos/sin are float32 values, so omitting it errs by 1e-7 in float64 models)
        cos, sin = self.cos.unsqueeze(1), self.sin.unsqueeze(1)
        return (self.keys * cos - rotate_half(self.keys) * sin) / (cos * cos + sin * sin)

    @property
    def rotates(self) -> bool:
        """Whether the layer rotates queries and keys by RoPE (False: smollm3's no-RoPE layers)."""
        return self.layout is None or self.layout.rope

    @property
    def sink_logits(self) -> torch.Tensor | None:
        """[q_heads] learned sink logits that enter the layer's softmax (gpt-oss), else None."""
        name = self.layout.sinks if self.layout is not None else None
        return getattr(self.module, name) if name else None

    def rope_at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin) [n, head_dim] of the model's RoPE at the given positions (e.g. future ones); cos 1 and
        sin 0 (no rotation) on a layer without RoPE."""
        if not self.rotates:
            ones = torch.ones(len(positions), self.head_dim, dtype=self.keys.dtype, device=self.keys.device)
            return ones, torch.zeros_like(ones)
        if self.rotary is None:
            raise ValueError("LayerInputs.rotary is not set: the model has no decoder rotary_emb")
        layer_type = () if self.layout is None or self.layout.rope_layer_type is None else (self.layout.rope_layer_type,)
        cos, sin = self.rotary(self.keys, positions.unsqueeze(0).to(self.keys.device), *layer_type)
        return cos[0], sin[0]
