"""The training data of the default model's recipe (train_retrieval.py): needle prompts with the spans the
supervised attention patterns point at.

Two kinds, both from the project's own RULER generators (training seeds < 10**6): dense short sequences of
needles and questions over a noise or needle haystack (make_sample, dense_batch: a curriculum of more needles
as steps go), and real-format RULER prompts with their key, value and answer spans located in the tokens
(real_sample, long_batch). encode() turns a built text into token ids with the attention targets.
"""

from __future__ import annotations

import os
import random
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from pytest_kvbench.tasks.ruler.needles import random_number, random_word_pair  # noqa: E402
from pytest_kvbench.tasks.ruler.niah import NIAH_CONFIGS, generate_niah  # noqa: E402
from pytest_kvbench.tasks.ruler.templates import NOISE_SENTENCE  # noqa: E402

HEADER = ("A special magic number is hidden within the following text. Make sure to memorize it. "
          "I will quiz you about the number afterwards.\n")
NEEDLE = "One of the special magic numbers for {key} is: {value}."
QUESTION = "What is the special magic number for {key} mentioned in the provided text?"
PREFIX = " The special magic number for {key} mentioned in the provided text is"


class Builder:
    """Builds a string piece by piece while remembering char spans of keys / values / answers."""

    def __init__(self):
        self.parts, self.n = [], 0
        self.needles = []  # dict(key, key_span, val_span)
        self.questions = []  # dict(key_spans, ans_span, needle)

    def add(self, s):
        start = self.n
        self.parts.append(s)
        self.n += len(s)
        return start, self.n

    def needle(self, key, value):
        a, _ = self.add("One of the special magic numbers for ")
        ks = self.add(key)
        self.add(" is: ")
        vs = self.add(value)
        self.add(".")
        self.needles.append(dict(key=key, value=value, key_span=ks, val_span=vs))

    def question(self, idx):
        nd = self.needles[idx]
        key = nd["key"]
        self.add("What is the special magic number for ")
        k1 = self.add(key)
        self.add(" mentioned in the provided text? The special magic number for ")
        k2 = self.add(key)
        self.add(" mentioned in the provided text is")
        ans = self.add(" " + nd["value"])
        self.add("</s>")
        self.questions.append(dict(key_spans=[k1, k2], ans_span=ans, needle=idx))

    def text(self):
        return "".join(self.parts)


def make_sample(rng, n_lines, n_needles, n_questions, haystack, repeat=False):
    """haystack: 'noise' (noise lines + needles), 'needle' (all lines are needles)."""
    keys, vals = [], []
    while len(keys) < n_needles:
        k = random_word_pair(rng)
        if k not in keys:
            keys.append(k)
            vals.append(random_number(rng))
    b = Builder()
    b.add(HEADER)
    if haystack == "needle":
        lines = ["N"] * n_needles
    else:
        lines = ["X"] * n_lines
        for _ in range(n_needles):
            lines.insert(rng.randint(0, len(lines)), "N")
    ni = 0
    for i, kind in enumerate(lines):
        if i:
            b.add("\n")
        if kind == "N":
            b.needle(keys[ni], vals[ni])
            ni += 1
        else:
            b.add(NOISE_SENTENCE)
    b.add("\n")
    asked = [rng.randrange(n_needles) for _ in range(n_questions)] if repeat else rng.sample(range(n_needles), n_questions)
    for j, idx in enumerate(asked):
        if j:
            b.add("\n")
        b.question(idx)
    return b


def encode(tok, b):
    text = b.text()
    enc = tok(text, return_offsets_mapping=True)
    ids = enc.input_ids
    offs = enc.offset_mapping

    def toks(span):
        s, e = span
        return [i for i, (a, c) in enumerate(offs) if a < e and c > s and c > a]

    tgt_kg = {}  # pos -> list of key token positions
    tgt_copy = {}  # pos -> needle position
    lm = {}  # pos -> target id
    nd_tok = []
    for nd in b.needles:
        kt = toks(nd["key_span"])
        vt = toks(nd["val_span"])
        assert len(vt) == 7, (vt, nd)
        sp = vt[0] - 1
        dot = vt[-1] + 1
        assert ids[sp] == 223 and ids[dot] == 16, (ids[sp], ids[dot])
        for p in range(kt[-1] + 1, dot + 1):
            tgt_kg[p] = kt
        nd_tok.append((sp, vt, dot))
    for q in b.questions:
        k1 = toks(q["key_spans"][0])
        k2 = toks(q["key_spans"][1])
        at = toks(q["ans_span"])  # ' ' + 7 digits
        assert len(at) == 8 and ids[at[0]] == 223
        eos = at[-1] + 1
        assert ids[eos] == 1
        for p in range(k1[-1] + 1, k2[0]):
            tgt_kg[p] = k1
        for p in range(k2[-1] + 1, eos + 1):
            tgt_kg[p] = k2
        sp, vt, dot = nd_tok[q["needle"]]
        # needle targets for positions at[0]-1 ... at[-1]: the position AFTER the needle token to output, whose
        # L0 previous-token feature carries that token's identity in a large, readable form
        src = [x + 1 for x in [sp] + vt + [dot]]
        assert src[-1] < len(ids)
        qpos = [at[0] - 1] + at
        for p, s in zip(qpos, src):
            tgt_copy[p] = s
        for p in qpos:
            lm[p] = ids[p + 1]
    return ids, tgt_kg, tgt_copy, lm


def real_sample(tok, rng, ctx, cfg):
    """generate_niah sample + answer; returns (Builder-like encode result)."""
    ex = generate_niah(NIAH_CONFIGS[cfg], tok, context_length=ctx, rng=rng, max_new_tokens=128)
    text = ex.input + ex.answer_prefix
    # rebuild spans from the text
    b = Builder()
    b.add(text)
    val = ex.outputs[0]
    for m in re.finditer(r"One of the special magic numbers for (\S+) is: (\d{7})\.", text):
        b.needles.append(dict(key=m.group(1), value=m.group(2), key_span=m.span(1), val_span=m.span(2)))
    qk = [m.span(1) for m in re.finditer(r"special magic number for (\S+) mentioned", text)]
    ans = b.add(" " + val)
    b.add("</s>")
    idx = [i for i, nd in enumerate(b.needles) if nd["value"] == val][0]
    b.questions.append(dict(key_spans=qk[-2:], ans_span=ans, needle=idx))
    return b


def collate(samples, pad=2):
    T = max(len(s[0]) for s in samples)
    B = len(samples)
    ids = torch.full((B, T), pad, dtype=torch.long)
    for i, s in enumerate(samples):
        ids[i, : len(s[0])] = torch.tensor(s[0])
    return ids, T


def dense_batch(tok, rng, bs, step=10**9):
    out = []
    cap = max(1, min(12, 1 + step // 40))  # curriculum: number of needles grows with steps
    for _ in range(bs):
        r = rng.random()
        if r < 0.5 or cap < 3:
            nn = rng.randint(1, cap)
            b = make_sample(rng, rng.randint(1, 10), nn, rng.randint(2, 4) if nn > 1 else 1, "noise", repeat=True)
        else:
            nn = rng.randint(2, cap + 2)
            b = make_sample(rng, 0, nn, rng.randint(2, 4), "needle", repeat=True)
        out.append(encode(tok, b))
    return out


def long_batch(tok, rng, bs, maxlen):
    out = []
    for _ in range(bs):
        r = rng.random()
        T = rng.randint(maxlen // 2, maxlen)
        if r < 0.35:
            b = real_sample(tok, random.Random(rng.randrange(10**6)), T, "niah_single_1")
        elif r < 0.6:
            b = real_sample(tok, random.Random(rng.randrange(10**6)), T, "niah_multikey_2")
        elif r < 0.8:
            nlines = max(2, (T - 40 - 3 * 45) // 24)
            nn = rng.randint(1, 12)
            b = make_sample(rng, nlines, nn, rng.randint(1, min(3, nn)), "noise")
        else:
            nn = max(4, (T - 40 - 3 * 45) // 22)
            b = make_sample(rng, 0, nn, 3, "needle")
        out.append(encode(tok, b))
    return out
