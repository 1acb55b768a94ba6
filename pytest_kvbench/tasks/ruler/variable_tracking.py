"""RULER variable tracking (vt): follow a chain of assignments through noise.

A chain "VAR AAAAA = 12345", "VAR BBBBB = VAR AAAAA ", ... (num_hops hops) is scattered in
order through RULER's noise lines; the model must list every variable holding the value.
RULER puts one solved example first (three-letter names, sized to 500 tokens) and the task
after it; both are built here the same way. Insertion points are drawn as fractions before
sizing so the sample depends only on the seed, not on the search.
"""

from __future__ import annotations

import random
import string

from .example import RulerExample, fill_template
from .sizing import count_tokens, largest_fitting_size
from .templates import NOISE_SENTENCE, VARIABLE_TRACKING

EXAMPLE_CONTEXT_LENGTH = 500  # RULER sizes the one-shot example to this many tokens


def generate_vt(tokenizer, *, context_length: int, rng: random.Random, num_chains: int = 1,
                num_hops: int = 4, max_new_tokens: int = VARIABLE_TRACKING.tokens_to_generate,
                size_hint: int | None = None) -> RulerExample:
    """RULER's vt sample: `num_chains` chains in the noise (RULER's num_chains), the question about the first."""
    return generate_vt_questions(tokenizer, context_length=context_length, rng=rng, num_chains=num_chains,
                                 num_hops=num_hops, max_new_tokens=max_new_tokens, size_hint=size_hint)[0]


def generate_vt_questions(tokenizer, *, context_length: int, rng: random.Random, num_chains: int = 1,
                          num_hops: int = 4, max_new_tokens: int = VARIABLE_TRACKING.tokens_to_generate,
                          size_hint: int | None = None) -> list[RulerExample]:
    """One sample per chain on one haystack (`vt:questions=K`, the shared-context protocol's groups): RULER's
    haystack with `num_chains` chains, question j asking for chain j's variables. The context before the
    question is the same for all; with one chain this is RULER's sample."""
    example = _chains_examples(tokenizer, rng, EXAMPLE_CONTEXT_LENGTH, max_new_tokens, num_chains,
                               min(10, num_hops), name_length=3, prefix="", size_hint=None)[0]
    shot = example.input + example.answer_prefix + " " + " ".join(example.outputs) + "\n\n" + "\n\n"
    return _chains_examples(tokenizer, rng, context_length, max_new_tokens, num_chains, num_hops,
                            name_length=5, prefix=shot, size_hint=size_hint)


def _chains_examples(tokenizer, rng: random.Random, context_length: int, max_new_tokens: int,
                     num_chains: int, num_hops: int, *, name_length: int, prefix: str,
                     size_hint: int | None) -> list[RulerExample]:
    names = _distinct_names(rng, num_chains * (num_hops + 1), name_length)
    chains, chain_names = [], []
    for start in range(0, len(names), num_hops + 1):
        these = names[start : start + num_hops + 1]
        chain = [f"VAR {these[0]} = {rng.randrange(10000, 99999)}"]
        chain += [f"VAR {these[j + 1]} = VAR {these[j]} " for j in range(num_hops)]
        chains.append(chain)
        chain_names.append(these)
    fractions = [sorted(rng.random() for _ in chain) for chain in chains]
    values = [chain[0].split("=")[-1].strip() for chain in chains]
    answer_prefixes = [VARIABLE_TRACKING.answer_prefix.format(num_v=num_hops + 1, query=value) for value in values]

    def prompt_for(size: int, question: int) -> tuple[str, int]:
        lines = [NOISE_SENTENCE + "\n"] * size
        for chain, chain_fractions in zip(chains, fractions):
            positions = [int(f * len(lines)) for f in chain_fractions]
            for offset, (position, statement) in enumerate(zip(positions, chain)):
                lines.insert(position + offset, statement)
        context = " ".join(lines).replace(". \n", ".\n")
        text, question_start = fill_template(VARIABLE_TRACKING.template, context, query=values[question],
                                             num_v=num_hops + 1)
        return prefix + text, len(prefix) + question_start

    budget = context_length - max_new_tokens
    size, length = largest_fitting_size(
        lambda n: max(count_tokens(tokenizer, prompt_for(n, j)[0] + answer_prefixes[j]) for j in range(num_chains)),
        budget,
        max_size=budget + 16, start=size_hint, what=f"variable tracking prompt (context length {context_length})",
    )
    examples = []
    for j in range(num_chains):
        text, question_start = prompt_for(size, j)
        examples.append(RulerExample(
            input=text, answer_prefix=answer_prefixes[j], outputs=chain_names[j],
            length=length if num_chains == 1 else count_tokens(tokenizer, text + answer_prefixes[j]),
            question_start=question_start, haystack_size=size))
    return examples


def _distinct_names(rng: random.Random, count: int, length: int) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choices(string.ascii_uppercase, k=length))
        if name not in names:
            names.append(name)
    return names
