"""NaN or inf in a model's logits fails the item with a message saying where and how many.

Scores computed from non-finite logits are meaningless, so the item fails rather than records them.
"""

from __future__ import annotations

import torch


class NonFiniteLogits(AssertionError):
    """NaN or inf in a model's logits: the item fails (its scores would be meaningless)."""


def check_logits_finite(logits: torch.Tensor, where: str) -> None:
    """Raise ``NonFiniteLogits`` naming ``where`` and how many NaN / inf values there are.

    One ``isfinite().all()`` on the happy path; the counting only happens on failure.
    """
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
