"""Random needle keys and values as RULER draws them.

Keys of type "words" are adjective-noun pairs from the wonderwords word lists (RULER builds
the full cross product and picks one; picking the adjective and the noun independently gives
the same distribution without building ten million strings). Numbers have seven digits and
uuids are version-4 UUIDs built from the sample's own random generator, so every draw is
reproducible from the sample seed.
"""

from __future__ import annotations

import functools
import random
import uuid

NEEDLE_TYPES = ("words", "numbers", "uuids")


@functools.cache
def wonderwords_list(filename: str) -> tuple[str, ...]:
    """Sorted, de-duplicated word list shipped with wonderwords (e.g. "nounlist.txt")."""
    # lazy: wonderwords is the RULER suite's optional extra
    from importlib.resources import files

    import wonderwords.assets

    text = files(wonderwords.assets).joinpath(filename).read_text(encoding="utf-8")
    return tuple(sorted({line.strip() for line in text.splitlines() if line.strip()}))


def random_word_pair(rng: random.Random) -> str:
    adjectives = wonderwords_list("adjectivelist.txt")
    nouns = wonderwords_list("nounlist.txt")
    return f"{rng.choice(adjectives)}-{rng.choice(nouns)}"


def random_number(rng: random.Random, digits: int = 7) -> str:
    return str(rng.randint(10 ** (digits - 1), 10**digits - 1))


def random_uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def random_needle(kind: str, rng: random.Random) -> str:
    """One random key or value of the given RULER needle type."""
    if kind == "words":
        return random_word_pair(rng)
    if kind == "numbers":
        return random_number(rng)
    if kind == "uuids":
        return random_uuid(rng)
    raise ValueError(f"unknown needle type {kind!r}; expected one of {', '.join(NEEDLE_TYPES)}")


def distinct_needles(kind: str, count: int, rng: random.Random, exclude: set[str] = frozenset()) -> list[str]:
    """``count`` different random values of one type, none of them in ``exclude``."""
    drawn: list[str] = []
    while len(drawn) < count:
        value = random_needle(kind, rng)
        if value not in exclude and value not in drawn:
            drawn.append(value)
    return drawn
