"""RULER common words extraction (cwe): find the ten words repeated most in a numbered list.

Ten common words appear ``freq_cw`` times and the others ``freq_ucw`` times, numbered and
shuffled; a solved example with a shorter list comes first. Words are the wonderwords nouns,
adjectives and verbs. Below 4096 tokens of context RULER uses lighter repetition (example 3/1,
task 6/1) so enough distinct words fit; that switch is kept.
"""

from __future__ import annotations

import random

from .example import RulerExample, fill_template
from .needles import wonderwords_list
from .sizing import count_tokens, largest_fitting_size
from .templates import COMMON_WORDS

SHORT_CONTEXT = 4096


def all_words() -> tuple[str, ...]:
    return tuple(sorted(set(wonderwords_list("nounlist.txt")) | set(wonderwords_list("adjectivelist.txt"))
                        | set(wonderwords_list("verblist.txt"))))


def generate_cwe(tokenizer, *, context_length: int, rng: random.Random, freq_cw: int = 30, freq_ucw: int = 3,
                 num_cw: int = 10, max_new_tokens: int = COMMON_WORDS.tokens_to_generate,
                 size_hint: int | None = None) -> RulerExample:
    words = all_words()
    if context_length < SHORT_CONTEXT:
        example_plan, task_repeats = (20, 3, 1), (6, 1)
    else:
        example_plan, task_repeats = (40, 10, 3), (freq_cw, freq_ucw)

    template = COMMON_WORDS.template + COMMON_WORDS.answer_prefix
    example_words = rng.sample(words, example_plan[0])
    example_context, example_common = _numbered_list(example_words, num_cw, *example_plan[1:], rng)
    shot = fill_template(template, example_context, query="")[0] + _numbered(example_common) + "\n"

    order = rng.sample(words, len(words))
    shuffle_seed = rng.getrandbits(64)

    def prompt_for(size: int) -> tuple[str, int, list[str]]:
        context, common = _numbered_list(order[: num_cw + size], num_cw, *task_repeats,
                                         random.Random(shuffle_seed))
        text, question_start = fill_template(COMMON_WORDS.template, context, query="")
        return shot + text, len(shot) + question_start, common

    budget = context_length - max_new_tokens
    size, length = largest_fitting_size(
        lambda n: count_tokens(tokenizer, prompt_for(n)[0] + COMMON_WORDS.answer_prefix), budget,
        max_size=len(words) - num_cw, start=size_hint, what=f"common words prompt (context length {context_length})",
    )
    text, question_start, common = prompt_for(size)
    return RulerExample(input=text, answer_prefix=COMMON_WORDS.answer_prefix, outputs=common, length=length,
                        question_start=question_start, haystack_size=size)


def _numbered(words: list[str]) -> str:
    return " ".join(f"{i + 1}. {word}" for i, word in enumerate(words))


def _numbered_list(words, num_common: int, common_repeats: int, uncommon_repeats: int,
                   rng: random.Random) -> tuple[str, list[str]]:
    common, uncommon = list(words[:num_common]), list(words[num_common:])
    listed = common * common_repeats + uncommon * uncommon_repeats
    rng.shuffle(listed)
    return _numbered(listed), common
