"""Keys with only some channels kept per KV head (ThinK's storage), and back to full width.

ThinK (think.py) keeps the prompt's keys thin; composed with KIVI (`think+kivi`) the thin keys are what gets
quantized (kivi_layer.py). Both go through this one gather and its inverse: the kept channels are stored,
the pruned ones read back as zeros, so q.k sums over the kept channels only.
"""

from __future__ import annotations

import torch

INDEX_BYTES = 8  # kept channel indices are stored as int64


def thinned(keys: torch.Tensor, channels: torch.Tensor) -> torch.Tensor:
    """keys [batch, heads, tokens, head_dim] -> [batch, heads, tokens, kept], channels [batch, heads, kept]."""
    return keys.gather(-1, channels.unsqueeze(2).expand(-1, -1, keys.shape[2], -1)).contiguous()


def widened(thin: torch.Tensor, channels: torch.Tensor, head_dim: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """The inverse of thinned(): [batch, heads, tokens, head_dim], the pruned channels zero (written into out)."""
    full = thin.new_zeros(*thin.shape[:3], head_dim) if out is None else out.zero_()
    return full.scatter_(-1, channels.unsqueeze(2).expand(-1, -1, thin.shape[2], -1), thin)
