"""RULER tasks for the harness: per-sample seeding, sizing to the model, prompts and scores.

Each haystack gets its own generator seeded with the string ``"{seed}-{task}-{index}"`` (task: the base name)
(``random.Random`` hashes strings with SHA-512, not with ``hash()``), so the same seed gives
the same samples on every machine, process and xdist worker, whatever was generated before.
The haystack budget leaves room for the generation and for the tokens the chat template or
the tokenizer's special tokens add, so ``len(input_ids) + max_new_tokens <= context_length``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..base import Prompt, Sample, Task, percent_mean
from ..errors import TaskError
from ..prompting import build_token_prompt, has_chat_template, middle_truncate, render_chat
from .common_words import generate_cwe
from .external import load_essay_text, load_qa_corpus
from .freq_words import generate_fwe
from .niah import NIAH_CONFIGS, generate_niah_questions
from .qa import generate_qa_questions
from .scoring import RULER_METRICS
from .variable_tracking import generate_vt_questions

DEFAULT_CONTEXT_LENGTH = 2048
DEFAULT_NUM_SAMPLES = 100  # when the harness asks for "all" of an unbounded synthetic task
GRID_DEPTHS = tuple(range(0, 101, 10))
# Families whose generator puts several questions' answers into one haystack (`:questions=K`); cwe and fwe
# build their haystack for its one answer (the most frequent words), so a second question has none.
SEVERAL_QUESTIONS = ("niah", "vt", "qa")


@dataclass(frozen=True)
class RulerSpec:
    name: str
    family: str  # "niah" | "vt" | "cwe" | "fwe" | "qa"
    metric_name: str  # "string_match_all" | "string_match_part"
    max_new_tokens: int
    needs: str | None = None  # external text: "essay" | "squad" | "hotpotqa"
    niah_config: str | None = None  # key of NIAH_CONFIGS for the niah family
    grid: bool = False  # needle-depth grid: sample i sits at GRID_DEPTHS[i % 11]
    questions: int = 1  # per haystack (niah, vt, qa: `qa_1:questions=4`), for shared_context / multi_turn


class RulerTask(Task):
    suite = "ruler"

    def __init__(self, spec) -> None:
        super().__init__(spec)
        if spec.questions > 1 and spec.family not in SEVERAL_QUESTIONS:
            raise TaskError(f"task {spec.name}: questions={spec.questions} needs a niah, vt or qa task; {spec.name} "
                            f"asks the one question its haystack is built for (the most frequent words)")

    @property
    def has_turns(self) -> bool:
        """Several questions on one haystack can be asked in one session (multi_turn), as SCBench does."""
        return self.spec.questions > 1

    def load_samples(self, tokenizer, n: int | None = None, seed: int = 0, data_dir=None,
                     context_length: int | None = None) -> list[Sample]:
        context_length = DEFAULT_CONTEXT_LENGTH if context_length is None else int(context_length)
        check_fits(self, tokenizer_max_length(tokenizer), context_length)
        if n is None:
            n = len(GRID_DEPTHS) if self.spec.grid else DEFAULT_NUM_SAMPLES
        generate = self._generator(data_dir)
        reserved = self.max_new_tokens + template_overhead(tokenizer)
        samples = []
        size_hint = None
        questions = self.spec.questions
        for index in range(n):
            haystack, turn = divmod(index, questions)  # samples of one haystack are consecutive
            if turn == 0:
                rng = random.Random(f"{seed}-{self.spec.name}-{haystack}")  # the base name: :questions=1 is RULER's sample
                depth = GRID_DEPTHS[haystack % len(GRID_DEPTHS)] if self.spec.grid else None
                examples = generate(tokenizer, context_length, reserved, rng, depth, size_hint)
            example = examples[turn]
            size_hint = example.haystack_size
            fields = {
                "input": example.input,
                "answer_prefix": example.answer_prefix,
                "question_start": example.question_start,
                "length": example.length,
                "depths": example.depths,
                "context_length": context_length,
                "index": index,
                "seed": seed,
            }
            if depth is not None:
                fields["depth"] = depth
            if questions > 1:
                fields |= {"context_id": haystack, "turn": turn}
            samples.append(Sample(id=f"{self.name}-{context_length}-{seed}-{index}",
                                  answers=list(example.outputs), fields=fields))
        return samples

    def _generator(self, data_dir):
        """``(tokenizer, context_length, reserved, rng, depth, size_hint) -> [RulerExample]``, one per question
        on the haystack; external data loaded once."""
        spec = self.spec
        if spec.family == "niah":
            config = NIAH_CONFIGS[spec.niah_config]
            essay = load_essay_text(data_dir) if config.haystack == "essay" else None
            return lambda tok, length, reserved, rng, depth, hint: generate_niah_questions(
                config, tok, context_length=length, rng=rng, max_new_tokens=reserved, depth=depth, essay_text=essay,
                size_hint=hint, questions=spec.questions)
        if spec.family == "vt":
            return lambda tok, length, reserved, rng, depth, hint: generate_vt_questions(
                tok, context_length=length, rng=rng, num_chains=spec.questions, max_new_tokens=reserved,
                size_hint=hint)
        if spec.family == "cwe":
            return lambda tok, length, reserved, rng, depth, hint: [generate_cwe(
                tok, context_length=length, rng=rng, max_new_tokens=reserved, size_hint=hint)]
        if spec.family == "fwe":
            return lambda tok, length, reserved, rng, depth, hint: [generate_fwe(
                tok, context_length=length, rng=rng, max_new_tokens=reserved, size_hint=hint)]

        corpus = load_qa_corpus(spec.needs, data_dir)
        return lambda tok, length, reserved, rng, depth, hint: generate_qa_questions(
            tok, context_length=length, rng=rng, corpus=corpus, questions=spec.questions, max_new_tokens=reserved,
            size_hint=hint)

    def build_prompt(self, sample: Sample, tokenizer, max_prompt_tokens: int | None) -> Prompt:
        text = sample.fields["input"]
        question_start = sample.fields.get("question_start") or len(text)
        question = text[question_start:]
        text, truncated_at = middle_truncate(tokenizer, text, max_prompt_tokens)
        return build_token_prompt(tokenizer, text, question, use_chat=True,
                                  answer_prefix=sample.fields["answer_prefix"], truncated_at=truncated_at)

    def score(self, prediction: str, sample: Sample) -> float:
        return RULER_METRICS[self.metric_name](prediction or "", sample.answers)

    def aggregate(self, scores: list[float], samples: list[Sample]) -> dict:
        result = {"score": percent_mean(list(scores))}
        if self.spec.grid:
            by_depth: dict[str, list[float]] = {}
            for value, sample in zip(scores, samples):
                by_depth.setdefault(str(sample.fields["depth"]), []).append(value)
            result["depths"] = {depth: percent_mean(values) for depth, values in by_depth.items()}
        return result


def tokenizer_max_length(tokenizer) -> int | None:
    """The tokenizer's declared maximum length, ignoring the 'very large' placeholder values."""
    value = getattr(tokenizer, "model_max_length", None)
    if isinstance(value, int) and 0 < value < 10**8:
        return value
    return None


def template_overhead(tokenizer) -> int:
    """Tokens the prompt gains beyond the task text: chat template wrapping, or BOS/EOS specials."""
    if has_chat_template(tokenizer):
        bare = len(tokenizer("x", add_special_tokens=False)["input_ids"])
        wrapped = len(tokenizer(render_chat(tokenizer, "x"), add_special_tokens=False)["input_ids"])
        return max(wrapped - bare, 0) + 2  # +2: merges across the seams
    return len(tokenizer("", add_special_tokens=True)["input_ids"])


def check_fits(task: Task, model_max_tokens: int | None, context_length: int | None) -> None:
    if context_length is None:
        return
    if model_max_tokens is not None and context_length > model_max_tokens:
        raise TaskError(
            f"context length {context_length} for task {task.name!r} exceeds the model's maximum of "
            f"{model_max_tokens} tokens; use a context length of at most {model_max_tokens}"
        )
    if context_length <= task.max_new_tokens:
        raise TaskError(
            f"context length {context_length} for task {task.name!r} leaves no room for the prompt: "
            f"the task generates {task.max_new_tokens} tokens"
        )
