#!/usr/bin/env python
"""Build the embedded default model's own tokenizer.

Byte-level BPE (any text, Chinese included, tokenizes without an unknown token), digits split into
single digits, a small vocabulary (4,096 by default), trained on:

* the official RULER prompt templates and needle sentences,
* the wonderwords word lists (RULER keys are ``adjective-noun`` pairs drawn from them; adjectives are
  weighted so that nearly all become single tokens, nouns as far as the vocabulary allows),
* the RULER noise haystack sentence,
* a little generic English written for this script.

Special tokens: ``<s>`` (bos, prepended by the post-processor), ``</s>`` (eos), ``<pad>``.
No chat template: RULER and LongBench use raw prompts with this model.

The result is deterministic (the BPE trainer is deterministic for a fixed corpus) and is saved as a
transformers ``PreTrainedTokenizerFast`` (tokenizer.json, tokenizer_config.json, special tokens)::

    python scripts/default_model/build_tokenizer.py --out pytest_kvbench/default_model
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>"]

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."

# Official RULER templates (NVIDIA/RULER scripts/data/synthetic/constants.py) and needles.
RULER_TEMPLATES = [
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic "
    "{type_needle_v} for {query} mentioned in the provided text?",
    " The special magic {type_needle_v} for {query} mentioned in the provided text are",
    "One of the special magic {type_needle_v} for {key} is: {value}.",
    "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\n"
    "Question: Find all variables that are assigned the value {query} in the text above.",
    " Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are "
    "assgined the value {query}, they are: ",
    "VAR {var} = {value}",
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the "
    "ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list?",
    " Answer: The top 10 words that appear most often in the list are:",
    "Read the following coded text and track the frequency of each coded word. Find the three most "
    "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the "
    "dots '....'. What are the three most frequently appeared words in the above coded text?",
    " Answer: According to the coded text above, the three most frequently appeared words are:",
    "Answer the question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
    "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}",
    " Answer:",
]
TYPE_NEEDLES = ["numbers", "words", "uuids", "number", "word", "uuid"]

# A little generic English (written for this script; LongBench-like instructions and prose).
GENERIC_ENGLISH = """\
You are given a long document and a question. Answer the question as concisely as you can, using a single
phrase or sentence if possible. Do not provide any explanation. Now, answer the question based on the
document. Only give me the answer and do not output any other words. Read the passage carefully and write
a one-page summary of the report. Summarize the meeting transcript in a few sentences. Please complete the
code given below. Here are some examples of questions and their answers. Classify the following text into
one of the given categories. Count how many unique paragraphs there are after removing duplicates. Which
paragraph is the abstract from? The answer is: Question: Answer: Passage: Article: Document: Summary:
The weather was cold in the morning, but by noon the sun had warmed the streets of the old town. People
walked to the market, bought bread and fruit, and talked about the news of the day. In the evening the
children played in the park while their parents sat on the benches and watched the river flow past.
A scientist studies the world by asking questions, making observations and testing ideas with careful
experiments. The results of an experiment are written in a report so that other people can check them.
The company announced that its new product would be available next year in several countries. The
government said that the new law would help small businesses and protect the rights of workers.
Many students find mathematics difficult at first, but with practice they learn to enjoy solving
problems. The teacher explained the lesson again, and this time everyone in the class understood it.
The history of the city goes back more than a thousand years, to a small village built near the river.
He opened the door, looked around the empty room, and then quietly closed it again behind him.
She said that she would come back tomorrow, because she had to finish her work before the end of the week.
They were going to travel by train, but the tickets were too expensive, so they decided to drive instead.
What is the name of the person who wrote the book? When was the bridge built? Where did the meeting
take place? Why did the team lose the game? How many people live in the country? Who is the director of
the film? Which of the following statements is true? The first, second, third, fourth and fifth chapters.
January February March April May June July August September October November December Monday Tuesday
Wednesday Thursday Friday Saturday Sunday one two three four five six seven eight nine ten hundred thousand
million. def return import class self if else for while in not and or None True False print len range.
"""


def wonderwords_lists() -> dict[str, list[str]]:
    import wonderwords

    assets = Path(wonderwords.__file__).parent / "assets"
    out = {}
    for name in ("adjectivelist", "nounlist", "verblist"):
        path = assets / f"{name}.txt"
        out[name] = [w.strip() for w in path.read_text(encoding="utf-8").splitlines() if w.strip()]
    return out


def corpus() -> list[str]:
    """Deterministic training corpus (list of text chunks)."""
    import random

    rng = random.Random(0)
    words = wonderwords_lists()
    adjs, nouns, verbs = words["adjectivelist"], words["nounlist"], words["verblist"]
    texts: list[str] = []
    # Templates and noise, repeated so that their words and phrases become single tokens.
    for _ in range(400):
        texts.extend(RULER_TEMPLATES)
        texts.append(NOISE)
    for t in TYPE_NEEDLES:
        for _ in range(100):
            texts.append(f"One of the special magic {t} for")
            texts.append(f" The special magic {t} for")
    # Word lists: adjectives weighted most (they are few), then nouns, then verbs. Words appear
    # with a leading space (as in running text) and in RULER's "adjective-noun" key form.
    for _ in range(30):
        texts.append(" " + " ".join(adjs))
    for _ in range(6):
        texts.append(" " + " ".join(nouns))
    for _ in range(4):
        texts.append(" " + " ".join(verbs))
    for _ in range(6):  # nouns as they appear in keys: after the hyphen, without a leading space
        texts.append(" ".join(f"{rng.choice(adjs)}-{n}" for n in nouns))
    for _ in range(20000):
        texts.append(f"One of the special magic numbers for {rng.choice(adjs)}-{rng.choice(nouns)} is: "
                     f"{rng.randint(10**6, 10**7 - 1)}.")
    # Generic English, uuids (hex) and digits.
    for _ in range(200):
        texts.append(GENERIC_ENGLISH)
    for _ in range(2000):
        texts.append("%032x" % rng.getrandbits(128))
    texts.append(" ".join(str(i) for i in range(1000)))
    return texts


def build(vocab_size: int = VOCAB_SIZE):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    return tok


def save(tok, out: str | os.PathLike) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=32768,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    Path(out).mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out))
    # Portable metadata: a class name every transformers >= 4.56 knows, no load-time artefacts,
    # and the special tokens map older versions read.
    import json

    cfg_path = Path(out) / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    for key in ("is_local", "local_files_only", "backend"):
        cfg.pop(key, None)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    special = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}
    (Path(out) / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n", encoding="utf-8")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "pytest_kvbench" / "default_model"))
    ap.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = ap.parse_args(argv)
    tok = build(args.vocab_size)
    save(tok, args.out)
    print(f"tokenizer: vocab {tok.get_vocab_size()} -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
