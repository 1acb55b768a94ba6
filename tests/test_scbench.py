"""SCBench: the official scorers (quirks included), first-turn templates, one sample per question."""

import json

import pytest
from test_tasks_support import tiny_tokenizer

from pytest_kvbench.tasks import DataError, available_tasks, get_task
from pytest_kvbench.tasks.scbench import scoring


def test_tasks_and_generation_lengths():
    lengths = {name: get_task(name).max_new_tokens for name in available_tasks("scbench")}
    assert lengths == {"scbench_kv": 150, "scbench_prefix_suffix": 150, "scbench_vt": 30, "scbench_qa_eng": 40,
                       "scbench_choice_eng": 40}


class TestScorers:
    @pytest.mark.parametrize("prediction, expected", [
        ("The value is ab12-cd34.", 1.0),
        ("ab12-cd34xyz", 1.0),    # a substring counts (InfiniteBench's word match would not)
        ("AB12-CD34", 0.0),       # case-sensitive
        ("", 0.0),
    ])
    def test_substring_match(self, prediction, expected):
        assert scoring.substring_match(prediction, "ab12-cd34") == expected

    @pytest.mark.parametrize("prediction, expected", [
        ("  hamburg, of course", 1.0), ("Hamb", 0.0), ("He went to HAMBURG", 1.0),
    ])
    def test_any_reference_in_prediction(self, prediction, expected):
        assert scoring.any_reference_in_prediction(prediction, ["Hamburg"]) == expected

    def test_string_match_all_rounds_to_two_decimals(self):
        assert scoring.string_match_all("abcde and fghij", ["ABCDE", "FGHIJ", "KLMNO"]) == 0.67
        assert scoring.string_match_all("ABCDE FGHIJ KLMNO", ["abcde", "fghij", "klmno"]) == 1.0

    def test_the_fixture_answers_score_full_marks(self):
        for name in available_tasks("scbench"):
            task = get_task(name)
            samples = task.load_samples(None, data_dir="fixtures")
            assert samples and all(task.score(" ".join(s.answers), s) == 1.0 for s in samples)


def write(folder, name, records):
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return str(folder)


class TestSamples:
    def test_one_sample_per_question_with_its_context(self):
        samples = get_task("scbench_kv").load_samples(None, data_dir="fixtures")
        assert [s.id for s in samples] == ["scbench_kv:0:0", "scbench_kv:0:1", "scbench_kv:0:2"]
        assert {s.fields["context_id"] for s in samples} == {"0"} and [s.fields["turn"] for s in samples] == [0, 1, 2]

    def test_at_most_five_turns_per_context_and_n_counts_questions(self, tmp_path):
        turns = [{"input": f"q{i}", "answer": f"a{i}"} for i in range(7)]
        folder = write(tmp_path, "scbench_qa_eng", [{"id": "c1", "context": "x", "multi_turns": turns},
                                                    {"id": "c2", "context": "y", "multi_turns": turns[:1]}])
        task = get_task("scbench_qa_eng")
        assert [s.id for s in task.load_samples(None, data_dir=folder)] == (
            [f"scbench_qa_eng:c1:{i}" for i in range(5)] + ["scbench_qa_eng:c2:0"])
        assert len(task.load_samples(None, n=2, data_dir=folder)) == 2

    def test_prompt_is_the_first_turn_template_in_the_chat_template(self):
        tokenizer = tiny_tokenizer(chat_template=True)
        task = get_task("scbench_qa_eng")
        sample = task.load_samples(None, data_dir="fixtures")[1]
        assert task.prompt_text(sample) == (
            "Read the book and answer the question. Be very concise in your answer.\n\n"
            + sample.fields["context"] + "\n\nQuestion: What did Jonas build?\nAnswer:"
        )
        prompt = task.build_prompt(sample, tokenizer, None)
        assert tokenizer.decode(prompt.input_ids).startswith("<s>[user] Read the book")
        assert tokenizer.decode(prompt.input_ids[prompt.context_len:]).lstrip().startswith("Question: What did Jonas")

    def test_choice_template_keeps_the_official_the_the_and_labels_the_letter(self):
        task = get_task("scbench_choice_eng")
        sample = task.load_samples(None, data_dir="fixtures")[0]
        assert sample.fields["label"] == ["Medicine", "B"]
        assert task.prompt_text(sample).endswith(
            "\n\nQuestion: What did Ilse study?\nA. Law\nB. Medicine\nC. Boatbuilding\nD. Music\n\n"
            "The the correct answer is"
        )
        assert task.score(" B. Medicine", sample) == 1.0 and task.score("A", sample) == 0.0

    @pytest.mark.parametrize("name, turn, message", [
        ("scbench_choice_eng", {"input": "q", "answer": "x", "options": ["a", "b", "c"]},
         r"multi_turns\[0\]: field 'options' must be a list of 4 strings"),
        ("scbench_choice_eng", {"input": "q", "answer": "x", "options": ["a", "b", "c", "d"]},
         r"multi_turns\[0\]: field 'answer' must be one of the options"),
        ("scbench_vt", {"input": "q", "answer": "ABCDE"}, r"multi_turns\[0\]: field 'answer' must be a non-empty list"),
        ("scbench_kv", {"input": "q", "answer": ["v"]}, r"multi_turns\[0\]: field 'answer' must be a non-empty string"),
        ("scbench_kv", {"answer": "v"}, r"multi_turns\[0\]: missing field 'input'"),
    ])
    def test_bad_turns_name_file_and_line(self, tmp_path, name, turn, message):
        folder = write(tmp_path, name, [{"id": 0, "context": "x", "multi_turns": [turn]}])
        with pytest.raises(DataError, match=rf"{name}\.jsonl:1: {message}"):
            get_task(name).load_samples(None, data_dir=folder)

    def test_a_context_without_questions_is_an_error(self, tmp_path):
        folder = write(tmp_path, "scbench_kv", [{"id": 0, "context": "x", "multi_turns": []}])
        with pytest.raises(DataError, match=r"scbench_kv\.jsonl:1: field 'multi_turns' is empty"):
            get_task("scbench_kv").load_samples(None, data_dir=folder)
