"""RULER needle-in-a-haystack generator (the eight niah_* tasks and the depth grids).

A needle "One of the special magic {numbers} for {key} is: {value}." is hidden in a haystack
that is either RULER's repeated noise sentence, essay prose, or other needles with random keys
(distractors). The haystack is sized with the model's own tokenizer so that the prompt plus
the generation fits the context length. All randomness comes from the ``rng`` passed in, and
everything random is drawn before sizing, so the same seed gives the same sample whatever the
tokenizer's speed or the number of sizing steps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ..errors import TaskError, TaskUnavailable
from .essays import essay_words, first_words, split_sentences
from .example import RulerExample, fill_template
from .needles import distinct_needles
from .sizing import count_tokens, largest_fitting_size
from .templates import NIAH, NOISE_SENTENCE

NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
# RULER picks essay needle depths from 40 evenly spaced integer percentages.
ESSAY_DEPTHS = tuple(round(100 * i / 39) for i in range(40))
HAYSTACKS = ("noise", "essay", "needle")

ESSAY_HELP = (
    "the essay haystack needs essay text: put Paul Graham's essays in <data_dir>/essays.txt "
    "(plain text) or <data_dir>/paul_graham_essays.json ({\"text\": ...}, as RULER's "
    "download_paulgraham_essay.py writes it) and pass data_dir"
)


@dataclass(frozen=True)
class NiahConfig:
    """One RULER niah configuration (scripts/synthetic.yaml)."""

    haystack: str  # "noise" | "essay" | "needle"
    type_needle_k: str  # "words" | "numbers" | "uuids"
    type_needle_v: str  # "numbers" | "uuids"
    num_needle_k: int = 1
    num_needle_v: int = 1
    num_needle_q: int = 1


NIAH_CONFIGS: dict[str, NiahConfig] = {
    "niah_single_1": NiahConfig("noise", "words", "numbers"),
    "niah_single_2": NiahConfig("essay", "words", "numbers"),
    "niah_single_3": NiahConfig("essay", "words", "uuids"),
    "niah_multikey_1": NiahConfig("essay", "words", "numbers", num_needle_k=4),
    "niah_multikey_2": NiahConfig("needle", "words", "numbers"),
    "niah_multikey_3": NiahConfig("needle", "uuids", "uuids"),
    "niah_multivalue": NiahConfig("essay", "words", "numbers", num_needle_v=4),
    "niah_multiquery": NiahConfig("essay", "words", "numbers", num_needle_q=4),
}


def generate_niah(config: NiahConfig, tokenizer, **settings) -> RulerExample:
    """One niah sample whose prompt fills ``context_length - max_new_tokens`` tokens as far as possible
    (generate_niah_questions with one question)."""
    return generate_niah_questions(config, tokenizer, questions=1, **settings)[0]


def generate_niah_questions(
    config: NiahConfig,
    tokenizer,
    *,
    context_length: int,
    rng: random.Random,
    max_new_tokens: int = NIAH.tokens_to_generate,
    depth: float | None = None,
    essay_text: str | None = None,
    size_hint: int | None = None,
    questions: int = 1,
) -> list[RulerExample]:
    """``questions`` niah samples on one haystack (the shared-context protocol's groups): the haystack
    holds the needles of every question, each question asks its own ``num_needle_q`` keys, and the
    context text before the question is the same for all. With one question this is RULER's sample.

    ``depth`` (0..100) puts every needle at that depth (for depth grids); otherwise depths are
    drawn as RULER does. A needle at depth d goes after ``int(units * d / 100)`` haystack units
    (sentences for essays, lines otherwise). ``size_hint`` (the haystack size of the previous
    sample) only speeds up sizing; the haystack is sized so that every question's prompt fits.
    """
    if config.haystack not in HAYSTACKS:
        raise TaskError(f"unknown haystack {config.haystack!r}; expected one of {', '.join(HAYSTACKS)}")
    if config.haystack == "essay" and essay_text is None:
        raise TaskUnavailable(ESSAY_HELP)
    if depth is not None and not 0 <= depth <= 100:
        raise TaskError(f"needle depth must be between 0 and 100, got {depth}")

    asked_per_question = config.num_needle_q
    num_keys = max(config.num_needle_k, asked_per_question * questions)
    keys = distinct_needles(config.type_needle_k, num_keys, rng)
    flat_values = distinct_needles(config.type_needle_v, num_keys * config.num_needle_v, rng)
    values = [flat_values[i * config.num_needle_v : (i + 1) * config.num_needle_v] for i in range(num_keys)]
    needles = [
        NEEDLE.format(type_needle_v=config.type_needle_v, key=key, value=value)
        for key, key_values in zip(keys, values)
        for value in key_values
    ]
    rng.shuffle(needles)
    asked = rng.sample(range(num_keys), asked_per_question * questions)
    per_question = [asked[j * asked_per_question : (j + 1) * asked_per_question] for j in range(questions)]

    if depth is not None:
        depths = [float(depth)] * len(needles)
    elif config.haystack == "essay":
        depths = [float(d) for d in rng.sample(ESSAY_DEPTHS, len(needles))]
    else:
        depths = [round(100 * rng.random(), 2) for _ in needles]

    template, prefix_template, type_needle_v = NIAH.template, NIAH.answer_prefix, config.type_needle_v
    if config.num_needle_q * config.num_needle_v == 1:
        template, prefix_template = _singular(template), _singular(prefix_template)
        type_needle_v = type_needle_v[:-1]

    def query_of(chosen: list[int]) -> str:
        queries = [keys[i] for i in chosen]
        return ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]

    queries = [query_of(chosen) for chosen in per_question]
    prefixes = [prefix_template.format(type_needle_v=type_needle_v, query=query) for query in queries]

    haystack = _haystack_builder(config, rng, set(keys), essay_text)

    built: dict[tuple[int, int], tuple[str, int]] = {}

    def prompt_for(size: int, question: int) -> tuple[str, int]:
        if (size, question) not in built:
            units, joiner = haystack(size)
            context = joiner.join(_interleave(units, needles, depths))
            built[size, question] = fill_template(template, context, type_needle_v=type_needle_v,
                                                  query=queries[question])
        return built[size, question]

    budget = context_length - max_new_tokens
    size, length = largest_fitting_size(
        lambda n: max(count_tokens(tokenizer, prompt_for(n, j)[0] + prefixes[j]) for j in range(questions)),
        budget,
        max_size=2 * max(budget, 0) + 16,
        start=size_hint, what=f"niah prompt (context length {context_length} minus {max_new_tokens} generated tokens)",
    )
    examples = []
    for j, chosen in enumerate(per_question):
        text, question_start = prompt_for(size, j)
        examples.append(RulerExample(
            input=text, answer_prefix=prefixes[j], outputs=[value for i in chosen for value in values[i]],
            length=length if questions == 1 else count_tokens(tokenizer, text + prefixes[j]), depths=depths,
            question_start=question_start, haystack_size=size,
        ))
    return examples


def _singular(text: str) -> str:
    """RULER's rewording of the template when exactly one value is asked for."""
    return text.replace("Some", "A").replace("are all", "is").replace("are", "is").replace("answers", "answer")


def _haystack_builder(config: NiahConfig, rng: random.Random, keys: set[str], essay_text: str | None):
    """A function ``size -> (units, joiner)``; the units for a size are a prefix of those for a larger size."""
    if config.haystack == "noise":
        return lambda size: ([NOISE_SENTENCE] * size, "\n")

    if config.haystack == "essay":
        words = essay_words(essay_text)
        return lambda size: (split_sentences(first_words(words, size)) if size else [], " ")

    distractor_rng = random.Random(rng.getrandbits(64))
    distractors: list[str] = []

    def needle_haystack(size: int):
        while len(distractors) < size:
            key = distinct_needles(config.type_needle_k, 1, distractor_rng, exclude=keys)[0]
            value = distinct_needles(config.type_needle_v, 1, distractor_rng)[0]
            distractors.append(NEEDLE.format(type_needle_v=config.type_needle_v, key=key, value=value))
        return distractors[:size], "\n"

    return needle_haystack


def _interleave(units: list[str], needles: list[str], depths: list[float]) -> list[str]:
    """Insert each needle after ``int(len(units) * depth / 100)`` units, keeping needle order on ties."""
    positions = [int(len(units) * d / 100) for d in depths]
    order = sorted(range(len(needles)), key=lambda i: (positions[i], i))
    out: list[str] = []
    start = 0
    for i in order:
        out.extend(units[start : positions[i]])
        out.append(needles[i])
        start = positions[i]
    out.extend(units[start:])
    return out
