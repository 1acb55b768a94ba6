"""RULER's generators with several questions per haystack (`:questions=K`, the group protocols' input).

What makes a group trustworthy: its K samples share the exact context tokens (so the engine groups them),
every question's answer is in that one haystack, the questions differ, the prompt still fits the context
length, the official template asks each question, and K=1 gives RULER's own sample unchanged.
"""

import json
import re

import pytest
from test_tasks_support import tiny_tokenizer

from pytest_kvbench.engine.protocol_runs import context_groups
from pytest_kvbench.tasks import TaskError, get_task
from pytest_kvbench.tasks.registry import split_name
from pytest_kvbench.tasks.ruler.specs import _NIAH_TASKS

CONTEXT = 1024


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture
def squad_dir(tmp_path):
    towns = ["Kelvy", "Ostwick", "Pellam", "Dunmore", "Arlen", "Brisk"]
    colors = ["red", "green", "blue", "amber", "violet", "grey"]
    paragraphs = [{"context": f"The lighthouse of {town} was painted {color} in {1900 + i}.",
                   "qas": [{"question": f"What color was the lighthouse of {town}?",
                            "answers": [{"text": color}], "is_impossible": False}]}
                  for i, (town, color) in enumerate(zip(towns, colors))]
    data = {"data": [{"title": f"Article {i}", "paragraphs": paragraphs[i:i + 2]} for i in range(0, 6, 2)]}
    (tmp_path / "squad.json").write_text(json.dumps(data))
    return tmp_path


def grouped(task_name, tokenizer, n, data_dir="fixtures", context_length=CONTEXT):
    task = get_task(task_name)
    samples = task.load_samples(tokenizer, n=n, seed=0, data_dir=data_dir, context_length=context_length)
    prompts = [task.build_prompt(sample, tokenizer, None) for sample in samples]
    return task, samples, prompts


def assert_one_haystack_per_group(task, samples, prompts, questions, context_length=CONTEXT):
    n = len(samples)
    assert context_groups(samples, prompts) == [list(range(i, i + questions)) for i in range(0, n, questions)]
    for start in range(0, n, questions):
        group = samples[start:start + questions]
        assert len({tuple(s.answers) for s in group}) == questions  # each question asks its own answer
        for sample in group:
            assert all(answer in sample.fields["input"] for answer in sample.answers)  # ... in the shared haystack
            assert sample.fields["turn"] == samples.index(sample) - start
    for prompt in prompts:
        assert len(prompt.input_ids) + task.max_new_tokens <= context_length


@pytest.mark.parametrize("name", sorted(_NIAH_TASKS))
def test_every_niah_variant_puts_several_questions_on_one_haystack(tokenizer, name):
    task, samples, prompts = grouped(f"{name}:questions=3", tokenizer, 6)
    assert_one_haystack_per_group(task, samples, prompts, 3)


def test_vt_asks_one_chain_per_question_on_one_haystack_of_chains(tokenizer):
    task, samples, prompts = grouped("vt:questions=3", tokenizer, 3, context_length=4096)  # a 3-chain example shot
    assert_one_haystack_per_group(task, samples, prompts, 3, context_length=4096)
    text = samples[0].fields["input"]
    for sample in samples:
        value = re.search(r"VAR " + sample.answers[0] + r" = (\d+)", text).group(1)
        assert sample.fields["answer_prefix"].endswith(f"assgined the value {value}, they are: ")
        assert sample.fields["input"][:sample.fields["question_start"]] == text[:samples[0].fields["question_start"]]
        assert sample.fields["input"].endswith(f"Find all variables that are assigned the value {value} in the text above.")


def test_qa_puts_every_questions_gold_paragraph_into_one_haystack(tokenizer, squad_dir):
    task, samples, prompts = grouped("qa_1:questions=3", tokenizer, 3, data_dir=squad_dir)
    assert_one_haystack_per_group(task, samples, prompts, 3)
    for sample in samples:
        town = re.search(r"Question: What color was the lighthouse of (\w+)\?$", sample.fields["input"]).group(1)
        assert f"The lighthouse of {town} was painted {sample.answers[0]}" in sample.fields["input"]
        assert task.score(sample.answers[0], sample) == 1.0


@pytest.mark.parametrize("name", ["niah_multikey_2", "vt", "qa_1"])
def test_one_question_per_haystack_is_rulers_own_sample(tokenizer, squad_dir, name):
    data_dir = squad_dir if name == "qa_1" else "fixtures"
    plain = get_task(name).load_samples(tokenizer, n=2, seed=0, data_dir=data_dir, context_length=CONTEXT)
    one = get_task(f"{name}:questions=1").load_samples(tokenizer, n=2, seed=0, data_dir=data_dir,
                                                        context_length=CONTEXT)
    assert [(s.fields["input"], s.answers) for s in plain] == [(s.fields["input"], s.answers) for s in one]


@pytest.mark.parametrize("name", ["cwe", "fwe"])
def test_word_frequency_tasks_refuse_several_questions_in_one_line(name):
    with pytest.raises(TaskError) as error:
        get_task(f"{name}:questions=2")
    assert "\n" not in str(error.value) and "the most frequent words" in str(error.value)


@pytest.mark.parametrize("name", ["qa_1:questions=1025", "niah_single_1:questions=" + "9" * 400,
                                  "math500:max_new_tokens=1048577"])
def test_a_setting_beyond_its_maximum_is_refused_at_collection(name):
    with pytest.raises(TaskError, match="must be at most"):
        split_name(name)


def test_several_questions_make_ruler_serve_multi_turn():
    assert get_task("niah_single_1:questions=2").has_turns and get_task("qa_1:questions=2").has_turns
    assert not get_task("niah_single_1").has_turns
