"""Equivalence through math-verify (Hugging Face), on the answer Qwen2.5-Math's rules extract.

The prediction's answer is taken by answer_extraction.py (reasoning block dropped, the last
``\\boxed{}``, a cut-off ``\\boxed{`` to the end of the text, Qwen2.5-Math's fallbacks); it is then
parsed exactly as the reference is, LaTeX in ``$...$`` (MATH-500 answers are LaTeX such as
``\\frac{14}{3}``; AIME answers are integers), and ``verify`` decides equivalence symbolically and
numerically (so ``0.5``, ``\\frac12`` and ``\\dfrac{1}{2}`` agree). math-verify's own timeouts are
switched off: they arm SIGALRM, which would cancel the harness's per-item time limit.
"""

from __future__ import annotations

import functools

from .answer_extraction import extract_answer, strip_reasoning


@functools.cache
def _configs():
    # lazy: math_verify is the reasoning suite's optional extra
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return [LatexExtractionConfig(), ExprExtractionConfig()]


def parse_answer(answer: str) -> list:
    """A bare answer parsed; an empty list when math-verify finds nothing in it."""
    # lazy: math_verify is an optional extra
    from math_verify import parse

    return parse(f"${answer}$", extraction_config=_configs(), parsing_timeout=None)



def predicted_answer(prediction: str) -> str:
    """What a prediction answers, as Qwen2.5-Math's evaluation extracts it after the reasoning block."""
    return extract_answer(strip_reasoning(prediction))


def is_equivalent(prediction: str, answer: str) -> bool:
    # lazy: math_verify is an optional extra
    from math_verify import verify

    extracted = predicted_answer(prediction)
    parsed = parse_answer(extracted) if extracted else []
    return bool(parsed) and bool(verify(parse_answer(answer), parsed, timeout_seconds=None))
