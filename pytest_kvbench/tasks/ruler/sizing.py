"""Fit a haystack to a token budget with few tokenizations.

RULER grows the haystack until the prompt no longer fits. Tokenizing a multi-thousand-token
prompt once per step is what makes naive generators slow, so here the token cost of one
haystack unit is learned from a small probe and used to jump close to the answer, then
corrected with the measured lengths (secant steps inside a shrinking bracket). Only sizes
that were actually measured are ever returned, so the budget is a hard guarantee.
"""

from __future__ import annotations

from collections.abc import Callable

from ..errors import TaskError


def count_tokens(tokenizer, text: str) -> int:
    """Number of tokens ``text`` encodes to, without special tokens (as RULER counts)."""
    return len(tokenizer.encode(text, add_special_tokens=False))


def largest_fitting_size(
    measure: Callable[[int], int],
    budget: int,
    *,
    max_size: int,
    probe: int = 16,
    start: int | None = None,
    what: str = "prompt",
) -> tuple[int, int]:
    """Largest ``n`` in ``[0, max_size]`` with ``measure(n) <= budget``; returns ``(n, measure(n))``.

    ``measure`` must be (close to) non-decreasing in ``n``. ``start`` is a first guess (the size
    found for the previous sample of the same task usually fits exactly, leaving one check of
    ``start + 1``); without it a small ``probe`` size estimates the cost of one unit. Raises
    TaskError when even ``n = 0`` exceeds the budget.
    """
    base = measure(0)
    if base > budget:
        raise TaskError(
            f"the {what} needs {base} tokens before any haystack is added, "
            f"more than the {budget} tokens available; use a larger context length"
        )
    lo, lo_len = 0, base          # largest size known to fit
    hi = max_size + 1             # smallest size known not to fit (or beyond the cap)
    guess = min(probe if start is None else max(start, 1), max_size)
    per_unit = 1.0
    steps = 0
    while hi - lo > 1:
        guess = min(max(guess, lo + 1), hi - 1)
        length = measure(guess)
        steps += 1
        per_unit = max((length - base) / guess, 1e-3)  # tokens per unit, refined at every step
        if length <= budget:
            lo, lo_len = guess, length
        else:
            hi = guess
        last, last_len = guess, length
        if steps > 8:  # secant steps are not converging (irregular tokenization): bisect
            guess = (lo + hi) // 2
        else:
            guess = last + int((budget - last_len) // per_unit)
    return lo, lo_len
