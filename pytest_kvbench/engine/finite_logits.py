"""NaN or inf in a model's logits fails the item with a message saying where and how many.

Scores computed from non-finite logits are meaningless, so the item fails rather than records them.
"""

from __future__ import annotations

import torch


class NonFiniteLogits(AssertionError):
    """NaN or inf in a model's logits: the item fails (its scores would be meaningless)."""


def check_logits_finite(logits: torch.Tensor, where: str) -> None:
    """Raise ``NonFiniteLogits`` naming ``where`` and how many NaN / inf values there are.

    The happy path is one sum: any NaN or infinity makes the sum NaN or infinite, so a finite sum proves every
    value finite, and it streams the tensor once where ``isfinite().all()`` writes a boolean per value (26x the
    time on teacher-forced log-probs of 6 rows x 128 positions x 262,144 tokens in float32, one thread: 1.38 s
    against 0.05 s). A sum that overflows with every value finite falls through to the exact check.
    """
    if bool(torch.isfinite(logits.sum())):
        return
    finite = torch.isfinite(logits)
    if bool(finite.all()):
        return
    nan = int(torch.isnan(logits).sum())
    inf = int(torch.isinf(logits).sum())
    first = tuple(int(i) for i in (~finite).nonzero()[0].tolist())
    raise NonFiniteLogits(
        f"non-finite logits in {where}: {nan} NaN and {inf} inf among {logits.numel()} values "
        f"(first at index {first}, shape {tuple(logits.shape)}, dtype {str(logits.dtype).replace('torch.', '')})"
    )
