"""LongBench v2: the official prompts, answer extraction, result.py's splits, loading data.json."""

import json

import pytest
from test_tasks_support import tiny_tokenizer

from pytest_kvbench.tasks import DataError, Sample, TaskUnavailable, get_task
from pytest_kvbench.tasks.longbench_v2.prompts import extract_answer
from pytest_kvbench.tasks.prompting import encode, middle_truncate

RECORD = {
    "_id": "q-1", "domain": "Single-Document QA", "sub_domain": "Legal", "difficulty": "hard", "length": "short",
    "question": "  Who signs the lease? ", "choice_A": "The tenant ", "choice_B": "The landlord",
    "choice_C": "Both", "choice_D": "Neither", "answer": "C",
    "context": "\nThe lease is signed by the tenant and by the landlord.\n",
}
# prompts/0shot.txt of THUDM/LongBench, filled as pred.py fills it (every value stripped).
OFFICIAL_ZERO_SHOT = (
    "Please read the following text and answer the question below.\n\n<text>\n"
    "The lease is signed by the tenant and by the landlord.\n</text>\n\n"
    "What is the correct answer to this question: Who signs the lease?\nChoices:\n"
    "(A) The tenant\n(B) The landlord\n(C) Both\n(D) Neither\n\n"
    'Format your response as follows: "The correct answer is (insert answer here)".'
)
OFFICIAL_COT = (
    "Please read the following text and answer the questions below.\n\n<text>\n"
    "The lease is signed by the tenant and by the landlord.\n</text>\n\n"
    "What is the correct answer to this question: Who signs the lease?\nChoices:\n"
    "(A) The tenant\n(B) The landlord\n(C) Both\n(D) Neither\n\n"
    "Let\u2019s think step by step:"
)


def write_data(folder, records):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "data.json").write_text(json.dumps(records, indent=1), encoding="utf-8")
    return folder


@pytest.fixture
def data_dir(tmp_path):
    return write_data(tmp_path / "longbench_v2", [RECORD])


def load(task, data_dir, n=None):
    return get_task(task).load_samples(None, n=n, data_dir=str(data_dir))


class TestPrompts:
    def test_zero_shot_equals_the_official_template(self, data_dir):
        task = get_task("longbench_v2")
        assert task.prompt_text(load("longbench_v2", data_dir)[0]) == OFFICIAL_ZERO_SHOT
        assert task.max_new_tokens == 128

    def test_cot_equals_the_official_template(self, data_dir):
        task = get_task("longbench_v2_cot")
        assert task.prompt_text(load("longbench_v2_cot", data_dir)[0]) == OFFICIAL_COT
        assert task.max_new_tokens == 1024

    def test_chat_template_always_applies_and_the_question_follows_the_context(self, data_dir):
        tokenizer = tiny_tokenizer(chat_template=True)
        task = get_task("longbench_v2")
        prompt = task.build_prompt(load("longbench_v2", data_dir)[0], tokenizer, None)
        text = tokenizer.decode(prompt.input_ids)
        assert text.startswith("<s>[user] Please read") and text.endswith("<s>[assistant] ")
        assert tokenizer.decode(prompt.input_ids[prompt.context_len:]).lstrip().startswith("</text>")

    def test_truncation_keeps_the_odd_token_in_the_tail(self):
        # pred.py: input_ids[:max_len//2] + input_ids[-max_len//2:], and -7//2 == -4.
        tokenizer = tiny_tokenizer()
        text = " ".join(f"word{i}" for i in range(80))
        ids = encode(tokenizer, text, special_tokens=True)
        v2, _ = middle_truncate(tokenizer, text, 7, odd_token_to_tail=True)
        v1, _ = middle_truncate(tokenizer, text, 7)
        head = tokenizer.decode(ids[:3], skip_special_tokens=True)
        assert v2 == head + tokenizer.decode(ids[-4:], skip_special_tokens=True)
        assert v1 == head + tokenizer.decode(ids[-3:], skip_special_tokens=True)


class TestAnswerExtraction:
    @pytest.mark.parametrize("response, expected", [
        ("The correct answer is (B)", "B"),
        ("**The correct answer is (C)**", "C"),  # asterisks are removed first
        ("So... The correct answer is D.", "D"),  # the bare-letter form
        ("The correct answer is (A). On reflection, The correct answer is (B).", "A"),  # the first wins
        ("the correct answer is (A)", None),  # case-sensitive
        ("The correct answer is: A", None),  # the letter must follow "is " directly
        ("The correct answer is (E)", None),
        ("", None),
    ])
    def test_extract_answer(self, response, expected):
        assert extract_answer(response) == expected

    def test_score_compares_the_letter(self, data_dir):
        task = get_task("longbench_v2")
        sample = load("longbench_v2", data_dir)[0]
        assert task.score("  The correct answer is (C)  ", sample) == 1.0
        assert task.score("The correct answer is (A)", sample) == 0.0
        assert task.score("", sample) == 0.0  # pred.py skips an empty response; here it counts as wrong


class TestSplits:
    def test_aggregate_reports_result_py_splits(self):
        samples = [Sample(f"s{i}", ["A"], {"difficulty": d, "length_class": n})
                   for i, (d, n) in enumerate([("easy", "short"), ("hard", "medium"), ("hard", "long")])]
        result = get_task("longbench_v2").aggregate([1.0, 0.0, 1.0], samples)
        assert result["score"] == 66.67
        assert result["splits"] == {"overall": 66.7, "easy": 100.0, "hard": 50.0,
                                    "short": 100.0, "medium": 0.0, "long": 100.0}

    def test_an_empty_group_is_none(self):
        samples = [Sample("s", ["A"], {"difficulty": "easy", "length_class": "short"})]
        splits = get_task("longbench_v2").aggregate([0.0], samples)["splits"]
        assert splits["hard"] is None and splits["easy"] == 0.0


class TestLoading:
    def test_fixtures_load_with_every_split_covered(self):
        samples = get_task("longbench_v2").load_samples(None, data_dir="fixtures")
        assert [s.id for s in samples] == ["fixture-lbv2-0001", "fixture-lbv2-0002", "fixture-lbv2-0003"]
        assert {s.fields["difficulty"] for s in samples} == {"easy", "hard"}
        assert {s.fields["length_class"] for s in samples} == {"short", "medium", "long"}
        assert all(s.answers[0] in "ABCD" for s in samples)

    def test_data_json_directly_in_the_folder_and_first_n(self, tmp_path):
        write_data(tmp_path, [RECORD, dict(RECORD, _id="q-2")])
        assert [s.id for s in load("longbench_v2", tmp_path, n=1)] == ["q-1"]

    def test_a_bad_record_names_file_and_line(self, tmp_path):
        folder = write_data(tmp_path, [RECORD, dict(RECORD, _id="q-2", difficulty="medium")])
        with pytest.raises(DataError, match=r"data\.json:\d+: field 'difficulty' must be one of easy, hard"):
            load("longbench_v2", folder)

    def test_a_missing_choice_is_an_error(self, tmp_path):
        record = {k: v for k, v in RECORD.items() if k != "choice_D"}
        with pytest.raises(DataError, match=r"data\.json:2: missing field 'choice_D'"):
            load("longbench_v2", write_data(tmp_path, [record]))

    def test_a_missing_file_is_unavailable_with_a_hint(self, tmp_path):
        with pytest.raises(TaskUnavailable, match="THUDM/LongBench-v2"):
            load("longbench_v2", tmp_path)


class TestCotFollowUp:
    def test_the_second_query_is_the_official_answer_template_without_the_context(self, data_dir):
        tokenizer = tiny_tokenizer(chat_template=True)
        task = get_task("longbench_v2_cot")
        sample = load("longbench_v2_cot", data_dir)[0]
        prompt = task.follow_up_prompt(sample, "  Both sign it.\n", tokenizer, None)
        text = tokenizer.decode(prompt.input_ids)
        # prompts/0shot_cot_ans.txt, with $COT$ the stripped reasoning
        assert text == "<s>[user] " + (
            "Please read the following text and answer the questions below.\n\nThe text is too long and omitted here.\n\n"
            "What is the correct answer to this question: Who signs the lease?\nChoices:\n"
            "(A) The tenant\n(B) The landlord\n(C) Both\n(D) Neither\n\n"
            "Let\u2019s think step by step: Both sign it.\n\n"
            "Based on the above, what is the single, most likely answer choice? Format your response as follows: "
            '"The correct answer is (insert answer here)".'
        ) + "</s><s>[assistant] "
        assert task.follow_up_max_new_tokens == 128

    def test_no_second_query_without_cot(self, data_dir):
        sample = load("longbench_v2", data_dir)[0]
        assert get_task("longbench_v2").follow_up_prompt(sample, "Both sign.", tiny_tokenizer(), None) is None

    @pytest.mark.parametrize("reasoning", [" \n", "\t  ", ""])
    def test_an_empty_or_blank_reasoning_still_gets_the_second_query(self, data_dir, reasoning):
        """THUDM/LongBench pred.py, get_pred: only ``output == ''`` skips; a blank output goes on to
        ``response = output.strip()`` and the 0shot_cot_ans.txt query with ``$COT$`` replaced by ''."""
        tokenizer = tiny_tokenizer(chat_template=True)
        sample = load("longbench_v2_cot", data_dir)[0]
        prompt = get_task("longbench_v2_cot").follow_up_prompt(sample, reasoning, tokenizer, None)
        text = tokenizer.decode(prompt.input_ids)
        assert "Let\u2019s think step by step: \n\nBased on the above, what is the single" in text
        assert "The text is too long and omitted here." in text

    def test_the_runner_generates_the_follow_up_with_the_method_and_scores_its_answer(self, monkeypatch):
        from pytest_kvbench.cases import Grid
        from pytest_kvbench.engine import runner as runner_module
        from pytest_kvbench.engine.runner import Runner

        calls = []

        def fake_generate(model, method, budget, input_ids, context_len, max_new_tokens, *args, **kwargs):
            calls.append((method.name, budget, max_new_tokens))
            return type("Result", (), {"tokens": runner_tokenizer.encode("The correct answer is (C)")})()

        runner = Runner(Grid(), "run")
        loaded, _ = runner.models.get("default")
        runner_tokenizer = loaded.tokenizer
        monkeypatch.setattr(runner_module, "generate", fake_generate)
        task = get_task("longbench_v2_cot")
        sample = task.load_samples(None, n=1, data_dir="fixtures")[0]
        from kvmethods import get_method

        answer = runner._follow_up(task, sample, "Summer is busiest.", get_method("snapkv"), "r0.5", loaded)
        assert calls == [("snapkv", "r0.5", 128)]
        assert task.score(answer, sample) == 1.0
        assert runner._follow_up(get_task("longbench_v2"), sample, "x", get_method("snapkv"), "r0.5", loaded) is None
