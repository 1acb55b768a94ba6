"""RULER frequent words extraction (fwe): the three most frequent coded words.

A vocabulary of random six-letter words is ranked and word k appears
``int(n * k**-alpha / zeta(alpha))`` times (a Zipf law), shuffled. The top-ranked word is
"..." (noise the model is told to ignore), so the answer is ranks 2 to 4. RULER draws
``context_length // 50`` words of vocabulary. RULER sizes this prompt to the whole context
length; here, like every task, it is sized so the generation fits too.
"""

from __future__ import annotations

import random
import string

from .example import RulerExample, fill_template
from .sizing import count_tokens, largest_fitting_size
from .templates import FREQ_WORDS


def generate_fwe(tokenizer, *, context_length: int, rng: random.Random, alpha: float = 2.0,
                 coded_wordlen: int = 6, vocab_size: int | None = None,
                 max_new_tokens: int = FREQ_WORDS.tokens_to_generate, size_hint: int | None = None) -> RulerExample:
    # lazy for startup time: scipy, only for the fwe task
    from scipy.special import zeta

    vocab_size = vocab_size or max(context_length // 50, 4)
    vocab: set[str] = set()
    while len(vocab) < vocab_size:
        vocab.add("".join(rng.choices(string.ascii_lowercase, k=coded_wordlen)))
    ranked = sorted(vocab)
    rng.shuffle(ranked)
    ranked[0] = "..."
    normaliser = float(zeta(alpha))
    shuffle_seed = rng.getrandbits(64)

    def prompt_for(num_words: int) -> tuple[str, int]:
        sampled = [word for k, word in enumerate(ranked, start=1)
                   for _ in range(int(num_words * k ** -alpha / normaliser))]
        random.Random(shuffle_seed).shuffle(sampled)
        return fill_template(FREQ_WORDS.template, " ".join(sampled), query="")

    budget = context_length - max_new_tokens
    size, length = largest_fitting_size(
        lambda n: count_tokens(tokenizer, prompt_for(n)[0] + FREQ_WORDS.answer_prefix), budget,
        max_size=4 * budget + 16, probe=max(budget // 8, 16),
        start=size_hint, what=f"frequent words prompt (context length {context_length})",
    )
    text, question_start = prompt_for(size)
    return RulerExample(input=text, answer_prefix=FREQ_WORDS.answer_prefix, outputs=ranked[1:4], length=length,
                        question_start=question_start, haystack_size=size)
