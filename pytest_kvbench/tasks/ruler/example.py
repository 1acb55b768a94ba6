"""The generated RULER sample, and filling a template so the question part can be found again."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RulerExample:
    input: str  # the task prompt with the template filled, without the answer prefix
    answer_prefix: str
    outputs: list[str]  # reference answers
    length: int  # tokens of input + answer_prefix
    depths: list[float] = field(default_factory=list)  # requested depth (0..100) per needle
    question_start: int | None = None  # character offset in ``input`` where the question begins
    haystack_size: int = 0  # haystack units used (a good ``size_hint`` for the next sample)


def fill_template(template: str, context: str, **values) -> tuple[str, int]:
    """``template`` filled; also returns where the text after ``{context}`` (the question) starts."""
    head, tail = template.split("{context}", 1)
    question = tail.format(**values)
    text = head.format(**values) + context + question
    return text, len(text) - len(question)
