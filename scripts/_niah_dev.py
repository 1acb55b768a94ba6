"""Development stand-in for ``pytest_kvbench.tasks.ruler.niah`` (official RULER niah templates).

Used by ``train_default_model.py`` only when the project's generator cannot be imported (it warns).
The shipped model is trained with the project's generator, so train and eval distributions match.
"""
from __future__ import annotations

import random
import uuid
from dataclasses import dataclass, field
from pathlib import Path

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
NEEDLE = "One of the special magic {type_needle_v} for {key} is: {value}."
TEMPLATE = ("Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic "
            "{type_needle_v} for {query} mentioned in the provided text?")
ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"


@dataclass
class RulerExample:
    input: str
    answer_prefix: str
    outputs: list
    length: int
    depths: list = field(default_factory=list)


NIAH_CONFIGS = {
    "niah_single_1": dict(type_haystack="noise", type_needle_k="words", type_needle_v="numbers", num_needle_k=1, num_needle_v=1, num_needle_q=1),
    "niah_multikey_1": dict(type_haystack="noise", type_needle_k="words", type_needle_v="numbers", num_needle_k=4, num_needle_v=1, num_needle_q=1),
    "niah_multikey_2": dict(type_haystack="needle", type_needle_k="words", type_needle_v="numbers", num_needle_k=1, num_needle_v=1, num_needle_q=1),
    "niah_multikey_3": dict(type_haystack="needle", type_needle_k="uuids", type_needle_v="uuids", num_needle_k=1, num_needle_v=1, num_needle_q=1),
    "niah_multivalue": dict(type_haystack="noise", type_needle_k="words", type_needle_v="numbers", num_needle_k=1, num_needle_v=4, num_needle_q=1),
    "niah_multiquery": dict(type_haystack="noise", type_needle_k="words", type_needle_v="numbers", num_needle_k=4, num_needle_v=1, num_needle_q=4),
}

_WORDS = None


def _words():
    global _WORDS
    if _WORDS is None:
        import wonderwords
        a = Path(wonderwords.__file__).parent / "assets"
        adjs = a.joinpath("adjectivelist.txt").read_text().split()
        nouns = a.joinpath("nounlist.txt").read_text().split()
        _WORDS = (adjs, nouns)
    return _WORDS


def _rand(kind, rng):
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "words":
        adjs, nouns = _words()
        return f"{rng.choice(adjs)}-{rng.choice(nouns)}"
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def generate_niah(config, tokenizer, context_length, rng, max_new_tokens=128, depth=None):
    if isinstance(config, str):
        config = NIAH_CONFIGS[config]
    c = config
    keys, values, needles = [], [], []
    for _ in range(c["num_needle_k"]):
        keys.append(_rand(c["type_needle_k"], rng))
        vs = []
        for _ in range(c["num_needle_v"]):
            vs.append(_rand(c["type_needle_v"], rng))
            needles.append(NEEDLE.format(type_needle_v=c["type_needle_v"], key=keys[-1], value=vs[-1]))
        values.append(vs)
    rng.shuffle(needles)
    idx = rng.sample(range(c["num_needle_k"]), c["num_needle_q"])
    queries = [keys[i] for i in idx]
    answers = [a for i in idx for a in values[i]]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    template, prefix, tv = TEMPLATE, ANSWER_PREFIX, c["type_needle_v"]
    if c["num_needle_q"] * c["num_needle_v"] == 1:
        template = template.replace("Some", "a").replace("are all", "is").replace("are", "is")
        prefix = prefix.replace("are", "is")
        tv = tv[:-1]
    budget = context_length - max_new_tokens

    def build(n):
        if c["type_haystack"] == "noise":
            sents = [NOISE] * n
        else:
            sents = [NEEDLE.format(type_needle_v=c["type_needle_v"], key=_rand(c["type_needle_k"], r2),
                                   value=_rand(c["type_needle_v"], r2)) for _ in range(n)]
        pos = sorted(r3.sample(range(n + 1), len(needles)), reverse=True)
        for p, nd in zip(pos, needles):
            sents.insert(p, nd)
        ctx = "\n".join(sents)
        return template.format(type_needle_v=tv, context=ctx, query=query)

    seed2 = rng.getrandbits(32)
    unit = len(tokenizer(NOISE if c["type_haystack"] == "noise" else NEEDLE.format(
        type_needle_v="numbers", key="abc-def", value="1234567"), add_special_tokens=False)["input_ids"]) + 1
    n = max(1, budget // unit)
    while True:
        r2, r3 = random.Random(seed2), random.Random(seed2 + 1)
        text = build(n)
        L = len(tokenizer(text + prefix.format(type_needle_v=tv, query=query))["input_ids"])
        if L <= budget or n <= 1:
            break
        n = max(1, n - max(1, (L - budget) // unit))
    return RulerExample(text, prefix.format(type_needle_v=tv, query=query), answers, L, [])
