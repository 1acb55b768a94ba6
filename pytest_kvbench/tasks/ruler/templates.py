"""Official RULER task templates, answer prefixes and generation lengths.

Values are RULER's (scripts/data/synthetic/constants.py), character for character, typos
included ("assgined"): a changed word changes what the model is asked and breaks comparison
with published numbers. ``template`` holds ``{context}`` and ``{query}``; the answer prefix is
appended after the template and is where the model's answer starts.
"""

from __future__ import annotations

from dataclasses import dataclass

# RULER's "noise" haystack line (niah_single_1 and variable tracking).
NOISE_SENTENCE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@dataclass(frozen=True)
class RulerTemplate:
    template: str
    answer_prefix: str
    tokens_to_generate: int


NIAH = RulerTemplate(
    template=(
        "Some special magic {type_needle_v} are hidden within the following text. "
        "Make sure to memorize it. I will quiz you about the {type_needle_v} afterwards.\n"
        "{context}\n"
        "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
    ),
    answer_prefix=" The special magic {type_needle_v} for {query} mentioned in the provided text are",
    tokens_to_generate=128,
)

VARIABLE_TRACKING = RulerTemplate(
    template=(
        "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
        "{context}\n"
        "Question: Find all variables that are assigned the value {query} in the text above."
    ),
    answer_prefix=(
        " Answer: According to the chain(s) of variable assignment in the text above, "
        "{num_v} variables are assgined the value {query}, they are: "
    ),
    tokens_to_generate=30,
)

COMMON_WORDS = RulerTemplate(
    template=(
        "Below is a numbered list of words. In these words, some appear more often than others. "
        "Memorize the ones that appear most often.\n"
        "{context}\n"
        "Question: What are the 10 most common words in the above list?"
    ),
    answer_prefix=" Answer: The top 10 words that appear most often in the list are:",
    tokens_to_generate=120,
)

FREQ_WORDS = RulerTemplate(
    template=(
        "Read the following coded text and track the frequency of each coded word. "
        "Find the three most frequently appeared coded words. {context}\n"
        "Question: Do not provide any explanation. Please ignore the dots '....'. "
        "What are the three most frequently appeared words in the above coded text?"
    ),
    answer_prefix=" Answer: According to the coded text above, the three most frequently appeared words are:",
    tokens_to_generate=50,
)

QA = RulerTemplate(
    template=(
        "Answer the question based on the given documents. "
        "Only give me the answer and do not output any other words.\n\n"
        "The following are given documents.\n\n"
        "{context}\n\n"
        "Answer the question based on the given documents. "
        "Only give me the answer and do not output any other words.\n\n"
        "Question: {query}"
    ),
    answer_prefix=" Answer:",
    tokens_to_generate=32,
)
