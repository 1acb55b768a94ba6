"""RULER question answering (qa_1 on SQuAD, qa_2 on HotpotQA): find the answer among many documents.

The question's gold document(s) are padded with other documents (first the rest of its
article for SQuAD, then random ones) until the context is full, shuffled, and numbered
"Document i:". The padding order and the shuffle are drawn before sizing so the sample
depends only on the seed.
"""

from __future__ import annotations

import random

from ..errors import TaskError
from .example import RulerExample, fill_template
from .external import QaCorpus
from .sizing import count_tokens, largest_fitting_size
from .templates import QA

DOCUMENT_PROMPT = "Document {i}:\n{document}"


def generate_qa(tokenizer, *, context_length: int, rng: random.Random, corpus: QaCorpus,
                max_new_tokens: int = QA.tokens_to_generate, size_hint: int | None = None) -> RulerExample:
    if not corpus.questions:
        raise TaskError("the QA corpus has no answerable questions")
    question = corpus.questions[rng.randrange(len(corpus.questions))]
    gold = list(question.gold)
    related = [doc for doc in question.related if doc not in gold]
    rng.shuffle(related)
    taken = set(gold) | set(related)
    others = [doc for doc in range(len(corpus.documents)) if doc not in taken]
    rng.shuffle(others)
    padding = related + others
    shuffle_seed = rng.getrandbits(64)

    def prompt_for(extra: int) -> tuple[str, int]:
        chosen = [corpus.documents[doc] for doc in gold + padding[:extra]]
        random.Random(shuffle_seed).shuffle(chosen)
        context = "\n\n".join(DOCUMENT_PROMPT.format(i=i + 1, document=doc) for i, doc in enumerate(chosen))
        return fill_template(QA.template, context, query=question.query)

    budget = context_length - max_new_tokens
    size, length = largest_fitting_size(
        lambda n: count_tokens(tokenizer, prompt_for(n)[0] + QA.answer_prefix), budget,
        max_size=len(padding), probe=4, start=size_hint, what=f"QA prompt with its gold documents (context length {context_length})",
    )
    text, question_start = prompt_for(size)
    return RulerExample(input=text, answer_prefix=QA.answer_prefix, outputs=list(question.outputs), length=length,
                        question_start=question_start, haystack_size=size)
