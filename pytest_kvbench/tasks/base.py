"""The task interface every benchmark task implements, and the shared aggregate.

Tasks are cheap objects: constructing one loads nothing, so the registry can build one per
collected item. Data is read in ``load_samples`` and nothing is cached across calls.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sample:
    """One benchmark example. ``id`` is stable across runs and machines."""

    id: str
    answers: list[str]
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass
class Prompt:
    """Token ids of a built prompt; ``input_ids[:context_len]`` is the context part and the rest
    is the question part (question, instructions after the context, answer prefix). A turn of a
    conversation (SCBench) holds the turns before it too, up to ``turn_start``."""

    input_ids: list[int]
    context_len: int
    # Where this turn's own tokens start (the multi_turn protocol feeds input_ids[turn_start:] on top of the
    # conversation so far); None: at context_len, the whole question part.
    turn_start: int | None = None


def percent_mean(scores: list[float]) -> float | None:
    """100 x mean rounded to 2 decimals, as both official evaluations report; None when empty."""
    if not scores:
        return None
    return round(100 * sum(scores) / len(scores), 2)


class Task:
    """Base class: subclasses set ``suite`` and implement the four methods. A task is built from
    its spec (a frozen dataclass with at least ``name``, ``metric_name`` and ``max_new_tokens``)."""

    name: str
    suite: str  # one of registry.SUITES
    metric_name: str
    max_new_tokens: int
    has_turns: bool = False  # a context's samples are the turns of one conversation (multi_turn protocol)
    # multi_turn: "model" keeps the model's own answers in the conversation; "gold": each turn's prompt holds
    # the reference answers of the turns before it (Prompt.turn_start), and the model's answers are dropped
    turn_history: str = "model"
    only_in_conversation: bool = False  # its samples mean something only under multi_turn
    # bumped (by the task's class, or per task) whenever its prompt or scoring changes: records carry it, and a
    # gate against a baseline of another version says "benchmark changed" instead of comparing scores (docs/tasks.md)
    version: int = 1

    def __init__(self, spec) -> None:
        self.spec = spec
        self.name = spec.name
        self.metric_name = spec.metric_name
        self.max_new_tokens = spec.max_new_tokens

    def load_samples(self, tokenizer, n: int | None = None, seed: int = 0, data_dir=None,
                     context_length: int | None = None) -> list[Sample]:
        raise NotImplementedError

    def build_prompt(self, sample: Sample, tokenizer, max_prompt_tokens: int | None) -> Prompt:
        raise NotImplementedError

    def score(self, prediction: str, sample: Sample) -> float:
        raise NotImplementedError

    def record_settings(self) -> dict:
        """Protocol settings of the task that the record's ``task`` names (SCBench: its history)."""
        return {}

    def aggregate(self, scores: list[float], samples: list[Sample]) -> dict:
        return {"score": percent_mean(list(scores))}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} ({self.suite}, {self.metric_name})>"
