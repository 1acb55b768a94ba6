"""RULER question answering (qa_1 on SQuAD, qa_2 on HotpotQA): find the answer among many documents.

The question's gold document(s) are padded with other documents (first the rest of its
article for SQuAD, then random ones) until the context is full, shuffled, and numbered
"Document i:". The padding order and the shuffle are drawn before sizing so the sample
depends only on the seed. `qa_1:questions=K` puts the gold documents of K questions into one
haystack (their articles' other paragraphs first in the padding) and asks each in its own sample.
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
    """RULER's qa sample: one question, its gold document(s) among distractors."""
    return generate_qa_questions(tokenizer, context_length=context_length, rng=rng, corpus=corpus,
                                 max_new_tokens=max_new_tokens, size_hint=size_hint)[0]


def generate_qa_questions(tokenizer, *, context_length: int, rng: random.Random, corpus: QaCorpus,
                          questions: int = 1, max_new_tokens: int = QA.tokens_to_generate,
                          size_hint: int | None = None) -> list[RulerExample]:
    """`questions` samples on one haystack (`qa_1:questions=K`, the shared-context protocol's groups): the
    documents hold the gold documents of every question among the padding, each sample asks its own
    question, and the context before the question is the same for all. With one question this is RULER's
    sample (the same draws from ``rng``)."""
    if len(corpus.questions) < questions:
        raise TaskError(f"the QA corpus has {len(corpus.questions)} answerable questions, fewer than the "
                        f"{questions} asked per haystack")
    chosen: list[int] = []
    while len(chosen) < questions:
        drawn = rng.randrange(len(corpus.questions))
        if drawn not in chosen:
            chosen.append(drawn)
    asked = [corpus.questions[i] for i in chosen]
    gold = list(dict.fromkeys(doc for question in asked for doc in question.gold))
    related = list(dict.fromkeys(doc for question in asked for doc in question.related if doc not in gold))
    rng.shuffle(related)
    taken = set(gold) | set(related)
    others = [doc for doc in range(len(corpus.documents)) if doc not in taken]
    rng.shuffle(others)
    padding = related + others
    shuffle_seed = rng.getrandbits(64)

    def prompt_for(extra: int, question: int) -> tuple[str, int]:
        documents = [corpus.documents[doc] for doc in gold + padding[:extra]]
        random.Random(shuffle_seed).shuffle(documents)
        context = "\n\n".join(DOCUMENT_PROMPT.format(i=i + 1, document=doc) for i, doc in enumerate(documents))
        return fill_template(QA.template, context, query=asked[question].query)

    budget = context_length - max_new_tokens
    size, length = largest_fitting_size(
        lambda n: max(count_tokens(tokenizer, prompt_for(n, j)[0] + QA.answer_prefix) for j in range(questions)),
        budget,
        max_size=len(padding), probe=4, start=size_hint,
        what=f"QA prompt with its gold documents (context length {context_length})",
    )
    examples = []
    for j, question in enumerate(asked):
        text, question_start = prompt_for(size, j)
        examples.append(RulerExample(
            input=text, answer_prefix=QA.answer_prefix, outputs=list(question.outputs),
            length=length if questions == 1 else count_tokens(tokenizer, text + QA.answer_prefix),
            question_start=question_start, haystack_size=size))
    return examples
