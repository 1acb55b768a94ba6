"""InfiniteBench: every scorer against hand-worked values of compute_scores.py (quirks included),
the open-model templates, ground truths, loading and bad records."""

import json

import pytest
from test_tasks_support import tiny_tokenizer

from pytest_kvbench.tasks import DataError, available_tasks, get_task
from pytest_kvbench.tasks.infinitebench import scoring

ALL_TASKS = {
    "passkey", "number_string", "kv_retrieval", "longbook_sum_eng", "longbook_qa_eng", "longbook_choice_eng",
    "longdialogue_qa_eng", "longbook_qa_chn", "code_debug", "code_run", "math_calc", "math_find",
}


def test_all_twelve_tasks_with_their_official_generation_lengths():
    assert set(available_tasks("infinitebench")) == ALL_TASKS
    lengths = {name: get_task(name).max_new_tokens for name in ALL_TASKS}
    assert lengths == {"passkey": 6, "number_string": 12, "kv_retrieval": 50, "longbook_sum_eng": 1200,
                       "longbook_choice_eng": 40, "longbook_qa_eng": 40, "longbook_qa_chn": 40,
                       "longdialogue_qa_eng": 40, "math_find": 3, "math_calc": 30000, "code_run": 5, "code_debug": 5}


class TestScorers:
    @pytest.mark.parametrize("prediction, label, expected", [
        ("71432.", ["71432"], 1.0),
        ("The pass key is 71432, I think", ["71432"], 1.0),
        ("7 1432", ["71432"], 0.0),  # only the first run of digits counts
        ("no digits", ["71432"], 0.0),
    ])
    def test_passkey_and_number_string(self, prediction, label, expected):
        assert scoring.passkey(prediction, label) == expected
        assert scoring.SCORERS["number_string"] is scoring.passkey

    @pytest.mark.parametrize("prediction, expected", [
        ('"ab12-cd34".', 1.0),       # quotes and the period are separators
        ("value:ab12-cd34!", 1.0),   # so are ':' and '!'
        ("(ab12-cd34)", 0.0),        # parentheses are not: the value is not a whole word
        ("ab12-cd34xyz", 0.0),
    ])
    def test_kv_retrieval_is_a_whole_word_match(self, prediction, expected):
        assert scoring.kv_retrieval(prediction, ["ab12-cd34"]) == expected
        assert scoring.kv_retrieval(prediction, "ab12-cd34") == expected  # the released preds' bare string

    @pytest.mark.parametrize("prediction, expected", [
        ("The value is -7", 1.0), ("-7 is the value", 0.0), ("x=-7", 0.0), ("", 0.0), ("`-7`.", 1.0),
    ])
    def test_code_run_reads_the_last_word(self, prediction, expected):
        assert scoring.code_run(prediction, [-7]) == expected

    @pytest.mark.parametrize("prediction, expected", [
        ("C. Configer._set_option", 1.0),
        ("C: it crashes", 1.0),
        ("The answer is: Configer._set_option", 1.0),
        ("The correct option is: C", 1.0),       # "is:" is a prefix too
        ("Option C", 0.0),                       # no prefix, and not "C." at the start
        ("C", 0.0),                              # a bare letter neither "C." nor "C:"
        ("answer: B", 0.0),
        ("The answer is:", 0.0),                 # the prediction ends at the prefix
    ])
    def test_code_debug(self, prediction, expected):
        assert scoring.code_debug(prediction, ["Configer._set_option", "C"]) == expected

    @pytest.mark.parametrize("prediction, label, expected", [
        ("88\n\nThe smallest number of the list is: 1", [88], 1.0),
        ("-88", [88], 1.0),    # no sign in the pattern
        ("88.5", [88], 0.0),   # the official int("88.5") raises; scored 0 here
        ("3.5", [3.5], 1.0),
        ("35", [3.5], 0.0),
        ("none", [3], 0.0),
    ])
    def test_math_find(self, prediction, label, expected):
        assert scoring.math_find(prediction, label) == expected

    @pytest.mark.parametrize("prediction, label, expected", [
        ("[5, 8, 6, 16, 12]", [5, 8, 6, 16, 12], 1.0),
        ("[5, 8, 7, 16, 12]", [5, 8, 6, 16, 12], 0.4),   # the matched prefix, over the label length
        ("[1, 2, -3]", [1, 2, -3], 2 / 3),                # the minus sign is lost
        ("5, 8", [[5, 8]], 1.0),                          # a nested label is unwrapped
        ("", [1, 2], 0.0),
    ])
    def test_math_calc(self, prediction, label, expected):
        assert scoring.math_calc(prediction, label) == pytest.approx(expected)

    @pytest.mark.parametrize("prediction, label, expected", [
        ("Green.", ["GREEN"], 1.0),
        ("Philip Green", ["ACE", "GREEN"], 0.0),  # only the first label is looked for
        ("ace", ["Ace"], 0.0),                   # words are upper-cased, the label is not
    ])
    def test_longdialogue_qa_eng(self, prediction, label, expected):
        assert scoring.longdialogue_qa_eng(prediction, label) == expected

    @pytest.mark.parametrize("prediction, expected", [
        ("C. Snowfield", 1.0),
        ("A", 0.0),
        ("Snowfield", 1.0),                                # the whole prediction equals the option
        (":\n\nThe answer is C. Snowfield.", 1.0),        # via the "answer is" prefix
        ("I pick BC", 0.0),                                # "BC" is a substring of "ABCD": a wrong choice
        ("Dear reader, the letter is C", 0.0),             # starts with "D": read as the answer D
        ("the letter is C", 1.0),                          # the first word that is a letter
        ("   ", 0.0),
    ])
    def test_longbook_choice_eng(self, prediction, expected):
        assert scoring.longbook_choice_eng(prediction, ["Snowfield", "C"]) == expected

    def test_longbook_qa_eng_token_f1(self):
        # [cael, dies, in, war] vs [fighting, in, world, war, 1]: 2 common, P 1/2, R 2/5 -> F1 4/9
        assert scoring.longbook_qa_eng("Cael dies in a war", ["fighting in world war 1"]) == pytest.approx(4 / 9)
        assert scoring.longbook_qa_eng("stockings", ["hat", "Stockings!"]) == 1.0

    def test_longbook_qa_chn_counts_characters(self):
        # 5 characters (comma dropped) vs 2, both found: P 2/5, R 1 -> F1 4/7
        assert scoring.longbook_qa_chn("程紫洁，薛鹊", ["薛鹊"]) == pytest.approx(4 / 7)

    def test_longbook_sum_eng_is_rouge_lsum_with_lines_as_sentences(self):
        reference = "the cat sat on the mat"
        # LCS 3 of 3 predicted and 6 reference tokens: P 1, R 1/2 -> F 2/3
        assert scoring.longbook_sum_eng("The cat sat.", [reference]) == pytest.approx(2 / 3)
        # Reordered lines: rougeL would give 1/2; rougeLsum takes the union of per-line LCS.
        assert scoring.longbook_sum_eng("on the mat\nthe cat sat", [reference]) == pytest.approx(1.0)
        assert scoring.longbook_sum_eng("the cat sat", ["a dog", "the cat sat"]) == pytest.approx(1.0)


def write(folder, name, records):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return folder


def one_sample(tmp_path, name, record):
    return get_task(name).load_samples(None, data_dir=str(write(tmp_path, name, [record])))[0]


class TestPrompts:
    def test_passkey_open_model_template(self, tmp_path):
        sample = one_sample(tmp_path, "passkey", {"id": 0, "context": "CTX", "input": "What is the pass key?",
                                                  "answer": ["123"], "options": []})
        assert get_task("passkey").prompt_text(sample) == (
            "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
            "I will quiz you about the important information.\n\nCTX\n\nWhat is the pass key?\n\nThe pass key is"
        )

    def test_choice_template_and_label(self):
        task = get_task("longbook_choice_eng")
        sample = task.load_samples(None, n=1, data_dir="fixtures")[0]
        assert sample.fields["label"] == ["Green", "C"]
        assert task.prompt_text(sample).endswith(
            "\n\nQuestion: What colour is the lighthouse door at the end of the story?\n"
            "A. Red\nB. Blue\nC. Green\nD. White\n\nThe letter of the correct answer is"
        )

    def test_code_run_names_the_function_and_call(self):
        task = get_task("code_run")
        sample = task.load_samples(None, data_dir="fixtures")[0]
        text = task.prompt_text(sample)
        assert text.startswith("There is a function called func_0 in the following Python code.\n\ndef func_0(x):")
        assert text.endswith("\n\nPlease compute the exact value of func_0(-3). The value of func_0(-3) is")

    def test_math_find_prefix_from_the_question(self):
        task = get_task("math_find")
        sample = task.load_samples(None, data_dir="fixtures")[0]
        assert task.prompt_text(sample) == (
            "What is the largest number in the following list?\n\n[12, 85, 3, 47, 61, 29, 7, 90, 33]\n\n"
            "What is the largest number in the list? The largest number of the list is: "
        )

    def test_code_debug_two_element_answer_is_kept(self, tmp_path):
        record = {"id": 3, "context": "def f(): pass", "input": "", "answer": ["f", "B"],
                  "options": ["g", "f", "h", "k"]}
        sample = one_sample(tmp_path, "code_debug", record)
        assert sample.fields["label"] == ["f", "B"] and sample.id == "code_debug:3"

    def test_no_chat_template_and_middle_truncation(self):
        tokenizer = tiny_tokenizer(chat_template=True)
        task = get_task("kv_retrieval")
        sample = task.load_samples(None, n=1, data_dir="fixtures")[0]
        full = task.build_prompt(sample, tokenizer, None)
        cut = task.build_prompt(sample, tokenizer, 41)
        assert "[user]" not in tokenizer.decode(full.input_ids)
        assert len(cut.input_ids) < len(full.input_ids)
        assert tokenizer.decode(cut.input_ids, skip_special_tokens=True).startswith("Extract the value")
        assert tokenizer.decode(cut.input_ids).endswith(tokenizer.decode(full.input_ids)[-20:])


class TestBadRecords:
    @pytest.mark.parametrize("name, record, message", [
        ("longbook_choice_eng", {"context": "c", "input": "q", "answer": ["Purple"], "options": ["a", "b", "c", "d"]},
         "must name one of the options"),
        ("longbook_choice_eng", {"context": "c", "input": "q", "answer": ["a"], "options": ["a", "b"]},
         "'options' must be a list of 4 strings"),
        ("passkey", {"context": "c", "input": "q", "answer": [71432]}, "must be a string of digits"),
        ("code_run", {"context": "c", "input": "what is f(3)?", "answer": [3]}, "no call like func_1"),
        ("code_run", {"context": "c", "input": "func_1(3)", "answer": ["3"]}, "must be an integer"),
        ("math_find", {"context": "c", "input": "The largest number of the list", "answer": ["9"]}, "must be a number"),
        ("math_calc", {"context": "c", "input": "", "answer": [["1", "2"]]}, "list of integers"),
        ("longbook_qa_eng", {"context": "c", "input": "q", "answer": []}, "'answer' is empty"),
        ("longbook_sum_eng", {"context": "c", "input": ""}, "missing field 'answer'"),
    ])
    def test_one_line_error_naming_file_and_line(self, tmp_path, name, record, message):
        folder = write(tmp_path, name, [{"context": "ok", "input": "func_1(2) The x of", "answer": _good(name),
                                         "options": ["a", "b", "c", "d"]}, record])
        with pytest.raises(DataError, match=rf"{name}\.jsonl:2: .*{message}") as error:
            get_task(name).load_samples(None, data_dir=str(folder))
        assert "\n" not in str(error.value)


def _good(name):
    return {"passkey": ["1"], "code_run": [1], "math_find": [1], "math_calc": [1], "longbook_choice_eng": ["a"]}.get(
        name, ["x"])


def test_fixtures_load_and_their_answers_score_full_marks():
    right_answers = {"passkey": ["71432", "40917", "88206"], "longbook_choice_eng": ["C", "B"],
                     "kv_retrieval": ["91c7e2b0-3f4d-4a5e-8b6c-7d8e9f0a1b2c", "5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a"],
                     "code_run": ["The value is -7"], "math_find": ["90"], "math_calc": ["[5, 8, 6, 16, 12]"],
                     "number_string": ["3000077442"], "longbook_qa_eng": ["In a tin box under the third stair."],
                     "longdialogue_qa_eng": ["Mara"], "longbook_qa_chn": ["经营茶园。"], "code_debug": ["B. mean"],
                     "longbook_sum_eng": ["Wren, a clockmaker, follows a letter from her missing brother to the coast and "
                                          "then to the northern islands, where she finds him repairing lighthouses."]}
    assert set(right_answers) == ALL_TASKS
    for name, predictions in right_answers.items():
        task = get_task(name)
        samples = task.load_samples(None, data_dir="fixtures")
        assert [task.score(p, s) for p, s in zip(predictions, samples)] == [1.0] * len(predictions)
        assert len(samples) == len(predictions)
    # The option text "Arcos" starts with A, so the official scorer reads it as the letter A.
    assert get_task("longbook_choice_eng").score("Arcos", samples_of("longbook_choice_eng")[1]) == 0.0


def samples_of(name):
    return get_task(name).load_samples(None, data_dir="fixtures")


def test_a_generation_longer_than_the_model_is_a_clear_error():
    from pytest_kvbench.tasks import TaskError

    task = get_task("math_calc")
    sample = task.load_samples(None, data_dir="fixtures")[0]
    with pytest.raises(TaskError, match=r"no room for the prompt \(-13616 tokens left after the generation length\); "
                                        r"shorten the generation with <task>:max_new_tokens=N"):
        task.build_prompt(sample, tiny_tokenizer(), 16384 - task.max_new_tokens)
