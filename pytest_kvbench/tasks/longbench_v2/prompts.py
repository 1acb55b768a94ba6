"""LongBench v2's prompt templates and answer extraction, as THUDM/LongBench (v2 branch) defines them.

Templates are prompts/0shot.txt, prompts/0shot_cot.txt and prompts/0shot_cot_ans.txt, kept
verbatim (the files end without a newline; "Let’s" has a typographic apostrophe). pred.py fills
them with ``str.replace`` on ``$DOC$``, ``$Q$``, ``$C_A$``..``$C_D$`` (and ``$COT$``), each value
``.strip()``-ed, so braces in a context need no escaping.
"""

from __future__ import annotations

import re

_QUESTION = (
    "What is the correct answer to this question: $Q$\n"
    "Choices:\n(A) $C_A$\n(B) $C_B$\n(C) $C_C$\n(D) $C_D$\n\n"
)
ZERO_SHOT = (
    "Please read the following text and answer the question below.\n\n<text>\n$DOC$\n</text>\n\n"
    + _QUESTION
    + 'Format your response as follows: "The correct answer is (insert answer here)".'
)
ZERO_SHOT_COT = (
    "Please read the following text and answer the questions below.\n\n<text>\n$DOC$\n</text>\n\n"
    + _QUESTION
    + "Let\u2019s think step by step:"
)
# The second CoT pass: the context is left out, the model's reasoning is pasted in.
ZERO_SHOT_COT_ANSWER = (
    "Please read the following text and answer the questions below.\n\nThe text is too long and omitted here.\n\n"
    + _QUESTION
    + "Let\u2019s think step by step: $COT$\n\n"
    'Based on the above, what is the single, most likely answer choice? Format your response as follows: '
    '"The correct answer is (insert answer here)".'
)
CHOICE_KEYS = ("choice_A", "choice_B", "choice_C", "choice_D")


def fill(template: str, record: dict, cot: str | None = None) -> str:
    """pred.py's filling: context, question and choices stripped, then substituted in this order."""
    text = template.replace("$DOC$", record["context"].strip()).replace("$Q$", record["question"].strip())
    for key in CHOICE_KEYS:
        text = text.replace(f"$C_{key[-1]}$", record[key].strip())
    return text.replace("$COT$", cot) if cot is not None else text


_WITH_PARENTHESES = re.compile(r"The correct answer is \(([A-D])\)")
_BARE = re.compile(r"The correct answer is ([A-D])")


def extract_answer(response: str) -> str | None:
    """pred.py's extract_answer: drop every ``*`` (markdown bold), then the first
    "The correct answer is (X)", else the first "The correct answer is X"; None when neither.

    Quirks kept: the match is case-sensitive ("the correct answer is (A)" is no answer), the
    first occurrence wins even when the model corrects itself later, and a bare letter must be
    a capital A-D directly after "is " (so "is: A" is no answer).
    """
    response = response.replace("*", "")
    for pattern in (_WITH_PARENTHESES, _BARE):
        match = pattern.search(response)
        if match:
            return match.group(1)
    return None
