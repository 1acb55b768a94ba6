"""RULER scoring (scripts/eval/synthetic/constants.py and evaluate.py), per sample in [0, 1].

A prediction is first cleaned as RULER does (control characters become newlines, surrounding
whitespace is stripped); a reference counts as found when it occurs in the prediction, case
insensitively. string_match_all: the share of the references found (all needles must be
recalled). string_match_part: 1 if any reference is found (QA with several gold spellings).
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f]")


def clean_prediction(prediction: str) -> str:
    return _CONTROL.sub("\n", (prediction or "").strip()).strip()


def string_match_all(prediction: str, references: list[str]) -> float:
    if not references:
        return 0.0
    text = clean_prediction(prediction).lower()
    return sum(reference.lower() in text for reference in references) / len(references)


def string_match_part(prediction: str, references: list[str]) -> float:
    text = clean_prediction(prediction).lower()
    return float(any(reference.lower() in text for reference in references))


RULER_METRICS = {"string_match_all": string_match_all, "string_match_part": string_match_part}
