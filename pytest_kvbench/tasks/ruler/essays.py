"""Essay haystack text: word-level cutting and sentence splitting.

RULER cuts the essay corpus after a number of whitespace-separated words and inserts needles
between sentences. It splits sentences with NLTK's punkt model, which needs a separate data
download; a punctuation rule (split after ``.``, ``!`` or ``?``, optionally followed by a
closing quote or bracket, before whitespace) gives the same boundaries on essay prose and
needs nothing. When the requested haystack is longer than the corpus, the corpus is repeated.
"""

from __future__ import annotations

import re

from ..errors import DataError

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+")


def essay_words(text: str) -> list[str]:
    words = re.sub(r"\s+", " ", text).strip().split(" ")
    if words == [""]:
        raise DataError("essay text is empty: the essay haystack needs some prose")
    return words


def first_words(words: list[str], count: int) -> str:
    """The first ``count`` words, cycling through the corpus if it is shorter."""
    repeats, rest = divmod(count, len(words))
    return " ".join(words * repeats + words[:rest])


def split_sentences(text: str) -> list[str]:
    return [part for part in _SENTENCE_END.split(text.strip()) if part]
