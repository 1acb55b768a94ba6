"""SCBench: the official scorers (quirks included), the conversation of each turn (gold or model history),
the official truncation after the chat template, per-turn scores."""

import json

import pytest
from test_tasks_support import tiny_tokenizer

from pytest_kvbench.tasks import DataError, Prompt, TaskError, available_tasks, get_task
from pytest_kvbench.tasks.scbench import scoring
from pytest_kvbench.tasks.scbench.conversation import truncate_tokens


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

    def test_the_first_turn_is_the_template_in_the_chat_template(self):
        tokenizer = tiny_tokenizer(chat_template=True)
        task = get_task("scbench_qa_eng")
        sample = task.load_samples(None, data_dir="fixtures")[0]
        assert task.prompt_text(sample) == (
            "Read the book and answer the question. Be very concise in your answer.\n\n"
            + sample.fields["context"] + "\n\nQuestion: Which city did Ilse move to?\nAnswer:"
        )
        prompt = task.build_prompt(sample, tokenizer, None)
        assert tokenizer.decode(prompt.input_ids).startswith("<s>[user] Read the book")
        assert tokenizer.decode(prompt.input_ids[prompt.context_len:]).lstrip().startswith("Question: Which city")
        assert prompt.turn_start is None

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


# What MInference scbench/eval_utils.py create_multiturn_prompt (commit fb56c91) returns as the second turn's
# prompt for the packaged fixtures' first context, with this file's tiny tokenizer (chat template: each
# message "<s>[role] content</s>", generation prompt "<s>[assistant] ") or without a chat template.
OFFICIAL_SECOND_TURNS = [
    ("scbench_qa_eng", True, "gold",
     "Hamburg</s><s>[user] Question: What did Jonas build?\nAnswer:</s><s>[assistant] "),
    ("scbench_qa_eng", True, "model", "<s>[user] Question: What did Jonas build?\nAnswer:</s><s>[assistant] "),
    ("scbench_qa_eng", False, "gold", "Hamburg\n\nQuestion: What did Jonas build?\nAnswer:"),
    ("scbench_qa_eng", False, "model", "Question: What did Jonas build?\nAnswer:"),
    ("scbench_choice_eng", True, "gold",
     "Medicine</s><s>[user] Question: Who ran the boatyard?\nA. Ilse\nB. Their father\nC. Jonas\nD. Nobody\n\n"
     "The the correct answer is</s><s>[assistant] "),
    ("scbench_choice_eng", False, "gold",
     "Medicine\n\nQuestion: Who ran the boatyard?\nA. Ilse\nB. Their father\nC. Jonas\nD. Nobody\n\n"
     "The letter of the correct answer is"),
    ("scbench_choice_eng", False, "model",
     "Question: Who ran the boatyard?\nA. Ilse\nB. Their father\nC. Jonas\nD. Nobody\n\nThe the correct answer is"),
]


class TestConversation:
    @pytest.mark.parametrize("name, chat, history, expected", OFFICIAL_SECOND_TURNS)
    def test_the_second_turn_adds_the_official_follow_up(self, name, chat, history, expected):
        tokenizer = tiny_tokenizer(chat_template=chat)
        task = get_task(f"{name}:history={history}")
        first, second = task.load_samples(None, n=2, data_dir="fixtures")
        first_prompt, second_prompt = (task.build_prompt(s, tokenizer, None) for s in (first, second))
        assert tokenizer.decode(second_prompt.input_ids[second_prompt.turn_start:]) == expected
        # gold: the whole conversation so far; model: the first turn, then this turn (its answers come at run time)
        assert second_prompt.input_ids[:second_prompt.turn_start] == first_prompt.input_ids
        assert second_prompt.context_len == first_prompt.context_len

    def test_with_gold_history_each_turn_continues_the_one_before(self):
        tokenizer = tiny_tokenizer(chat_template=True)
        task = get_task("scbench_kv")
        prompts = [task.build_prompt(s, tokenizer, None) for s in task.load_samples(None, data_dir="fixtures")]
        assert len(prompts) == 3
        for before, after in zip(prompts, prompts[1:]):
            assert after.input_ids[:after.turn_start] == before.input_ids
        third = tokenizer.decode(prompts[2].input_ids[prompts[1].turn_start:])
        assert third.startswith("a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d</s><s>[user] Key:")  # turn 1's gold answer
        assert "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9</s><s>[user] Key:" in third  # turn 2's

    def test_a_list_answer_goes_in_as_python_writes_it(self):
        """create_multiturn_prompt inserts str(answer): scbench_vt's list of variables reads as a list."""
        task = get_task("scbench_vt")
        turns = [{"input": "q1", "answer": ["X1", "X2"]}, {"input": "q2", "answer": ["Y1"]}]
        from pytest_kvbench.tasks.scbench.conversation import follow_up_text

        text = follow_up_text(task.spec, tiny_tokenizer(), False, True, turns[0], turns[1])
        assert text == "['X1', 'X2']\n\nq2"


class TestTruncation:
    @pytest.mark.parametrize("limit, kept", [(6, [0, 1, 2, 8, 9, 10]), (7, [0, 1, 2, 8, 9, 10]), (11, list(range(11)))])
    def test_truncate_input_keeps_the_first_and_last_half_of_the_limit(self, limit, kept):
        """run_scbench.py truncate_input(list(range(11)), limit): input[:limit // 2] + input[-(limit // 2):]."""
        assert truncate_tokens(Prompt(list(range(11)), 9), limit).input_ids == kept

    @pytest.mark.parametrize("context_len, moved", [(9, 4), (5, 3), (2, 2)])
    def test_the_context_boundary_moves_with_the_cut(self, context_len, moved):
        assert truncate_tokens(Prompt(list(range(11)), context_len), 6).context_len == moved

    def test_the_chat_template_comes_first_and_every_turn_keeps_room_for_its_answer(self):
        """run_scbench.py: the templated first turn is tokenized, then cut to max_seq_length - max_new_tokens x
        turns; here max_prompt_tokens (= max_seq_length - max_new_tokens) less the other turns' answers."""
        tokenizer = tiny_tokenizer(chat_template=True)
        task = get_task("scbench_kv")  # 3 turns of 150 tokens
        sample = task.load_samples(None, data_dir="fixtures")[0]
        whole = task.build_prompt(sample, tokenizer, None)
        limit = len(whole.input_ids) - 41
        prompt = task.build_prompt(sample, tokenizer, limit + 2 * 150)
        assert len(prompt.input_ids) == 2 * (limit // 2)  # the chat template's own tokens count in the limit
        text = tokenizer.decode(prompt.input_ids)
        assert text.startswith("<s>[user] Extract the value") and text.endswith("</s><s>[assistant] ")
        assert prompt.input_ids[prompt.context_len:] == whole.input_ids[whole.context_len:]  # the question is kept

    def test_no_room_left_is_a_task_error(self):
        sample = get_task("scbench_kv").load_samples(None, data_dir="fixtures")[0]
        with pytest.raises(TaskError, match="no room for the first turn"):
            get_task("scbench_kv").build_prompt(sample, tiny_tokenizer(), 301)


class TestHistorySetting:
    def test_gold_is_the_default_and_the_record_names_it(self):
        assert get_task("scbench_kv").turn_history == "gold"
        assert get_task("scbench_kv").record_settings() == {"history": "gold"}
        model = get_task("scbench_kv:history=model")
        assert model.turn_history == "model" and model.record_settings() == {"history": "model"}
        assert model.only_in_conversation and not get_task("scbench_kv").only_in_conversation

    @pytest.mark.parametrize("name, message", [
        ("scbench_kv:history=mine", "history must be one of gold, model, got 'mine'"),
        ("niah_single_1:history=gold", "niah_single_1 takes no history setting"),
        ("scbench_kv:history", "unknown setting 'history'"),
    ])
    def test_bad_history_settings_are_task_errors(self, name, message):
        with pytest.raises(TaskError, match=message):
            get_task(name)


def test_aggregate_reports_each_turn_and_the_pooled_score():
    """compute_scores.py groups predictions by turn_idx and prints 100 x accuracy of each to 3 decimals."""
    task = get_task("scbench_kv")
    samples = [type("S", (), {"fields": {"turn": t}})() for t in (0, 1, 2, 0, 1, 2, 0)]
    aggregate = task.aggregate([1, 0, 1, 1, 1, 0, 0], samples)
    assert aggregate == {"score": 57.14, "turns": {"1": 66.667, "2": 50.0, "3": 50.0}}
