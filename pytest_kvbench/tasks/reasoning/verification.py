"""Answer extraction and equivalence through math-verify (Hugging Face), not string rules.

The reference answer is parsed as LaTeX in ``$...$`` (MATH-500 answers are LaTeX such as
``\\frac{14}{3}``; AIME answers are integers). The prediction is searched for its final answer
with ``\\boxed{}`` first (``boxed_match_priority=0``), then the package's "final answer is"
patterns and plain expressions; ``verify`` then decides equivalence symbolically and
numerically (so ``0.5``, ``\\frac12`` and ``\\dfrac{1}{2}`` agree). math-verify's own timeouts are
switched off: they arm SIGALRM, which would cancel the harness's per-item time limit.
"""

from __future__ import annotations

import functools


@functools.cache
def _configs():
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    gold = [LatexExtractionConfig(), ExprExtractionConfig()]
    prediction = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
    return gold, prediction


def parse_reference(answer: str) -> list:
    """The parsed reference; an empty list when math-verify finds nothing in it."""
    from math_verify import parse

    return parse(f"${answer}$", extraction_config=_configs()[0], parsing_timeout=None)


def is_equivalent(prediction: str, answer: str) -> bool:
    from math_verify import parse, verify

    extracted = parse(prediction, extraction_config=_configs()[1], parsing_timeout=None)
    return bool(extracted) and bool(verify(parse_reference(answer), extracted, timeout_seconds=None))
