"""The dtypes attention scores are computed in, one policy for every kernel that recomputes attention.

Scores, softmax rows and sums are float32 (float64 for float64 models): bf16 sums lose the ranking of close
positions. The big attention products (H2O's accumulated attention, KVzip's reconstruction pass) run in the
model's dtype on an accelerator, as both references do, and in float32 on a CPU. It sits in core because the
scorers and the attention function KVzip installs (attention/kvzip_attention.py) share it.
"""

from __future__ import annotations

import torch


def score_dtype(tensor: torch.Tensor) -> torch.dtype:
    """float32 for half/bfloat16/float32 models, float64 for float64 ones."""
    return torch.promote_types(tensor.dtype, torch.float32)


def product_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype of the big attention products of H2O's and KVzip's scoring: the model's on an accelerator
    (tensor cores and half the memory traffic for bf16; both references compute in it), score_dtype on a
    CPU, whose bf16 products into strided blocks and bf16 softmax are slower than float32 (H2O at 8k tokens
    on a Qwen2.5-0.5B layer: 4.75x the CPU time, docs/performance.md)."""
    return tensor.dtype if tensor.device.type != "cpu" else score_dtype(tensor)
