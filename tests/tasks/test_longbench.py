"""LongBench tasks: official templates, truncation, chat-template rules, data loading, scoring."""

import json

import pytest
from test_tasks_support import tiny_tokenizer

from pytest_kvbench.tasks import FIXTURE_DIR, DataError, TaskUnavailable, get_task

TRIVIAQA_RECORD = {
    "input": "Question: Which river flows through Lindmere?\nAnswer:",
    "context": "Passage: Lindmere lies on the river Avel.\nQuestion: Where is Ostwick?\nAnswer: On the coast.",
    "answers": ["Avel", "the Avel river"],
    "length": 16,
    "dataset": "triviaqa",
    "language": "en",
    "all_classes": None,
    "_id": "trivia-1",
}


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


@pytest.fixture
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture
def chat_tokenizer():
    return tiny_tokenizer(chat_template=True)


class TestTemplates:
    def test_trec_template_filled(self, tokenizer):
        task = get_task("trec")
        sample = task.load_samples(tokenizer, n=1, data_dir="fixtures")[0]
        expected = (
            "Please determine the type of the question below. Here are some examples of questions.\n\n"
            + sample.fields["context"] + "\n" + sample.fields["input"]
        )
        assert task.prompt_text(sample) == expected

    def test_hotpotqa_question_part(self, tokenizer):
        task = get_task("hotpotqa")
        sample = task.load_samples(tokenizer, n=1, data_dir="fixtures")[0]
        assert task.question_text(sample) == (
            "\n\nAnswer the question based on the given passages. Only give me the answer and do not output any "
            "other words.\n\nQuestion: " + sample.fields["input"] + "\nAnswer:"
        )

    @pytest.mark.parametrize("name, official", [
        ("multi_news", ("You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}"
                        "\n\nNow, write a one-page summary of all the news.\n\nSummary:")),
        ("lcc", "Please complete the code given below. \n{context}Next line of code:\n"),
        ("repobench-p", "Please complete the code given below. \n{context}{input}Next line of code:\n"),
        ("lsht", "请判断给定新闻的类别，下面是一些例子。\n\n{context}\n{input}"),
        ("vcsum", "下面有一段会议记录，请你阅读后，写一段总结，总结会议的内容。\n会议记录：\n{context}\n\n会议总结："),
    ])
    def test_official_templates_verbatim(self, name, official):
        assert get_task(name).spec.prompt == official

    def test_spacing_quirks_kept(self):
        assert "\n\nArticle: {context}\n\n Answer the question based on the above article" in get_task("qasper").spec.prompt
        assert get_task("passage_count").spec.prompt.endswith("\n\nThe final answer is: ")
        assert get_task("passage_retrieval_en").spec.prompt.endswith("\"Paragraph 2\", etc.\n\nThe answer is: ")

    def test_generation_lengths_and_metrics(self):
        expected = {"narrativeqa": (128, "qa_f1"), "gov_report": (512, "rouge_l"), "samsum": (128, "rouge_l"),
                    "trec": (64, "classification"), "passage_count": (32, "count"), "dureader": (128, "rouge_l_zh"),
                    "lsht": (64, "classification"), "repobench-p": (64, "code_sim"),
                    "passage_retrieval_zh": (32, "retrieval_zh"), "multifieldqa_zh": (64, "qa_f1_zh")}
        for name, (max_new_tokens, metric) in expected.items():
            task = get_task(name)
            assert (task.max_new_tokens, task.metric_name, task.suite) == (max_new_tokens, metric, "longbench")

    def test_longbench_e_uses_the_base_task_definition(self):
        task, base = get_task("lcc_e"), get_task("lcc")
        assert (task.max_new_tokens, task.metric_name, task.spec.prompt) == (
            base.max_new_tokens, base.metric_name, base.spec.prompt)


class TestPromptBuilding:
    def test_no_truncation_when_short(self, tokenizer):
        task = get_task("hotpotqa")
        sample = task.load_samples(tokenizer, n=1, data_dir="fixtures")[0]
        prompt = task.build_prompt(sample, tokenizer, 100_000)
        assert tokenizer.decode(prompt.input_ids) == task.prompt_text(sample)

    def test_middle_truncation_keeps_both_ends(self, tokenizer):
        task = get_task("gov_report")
        sample = task.load_samples(tokenizer, n=1, data_dir="fixtures")[0]
        full = task.prompt_text(sample)
        prompt = task.build_prompt(sample, tokenizer, 200)
        text = tokenizer.decode(prompt.input_ids)
        assert len(prompt.input_ids) <= 200
        assert text.startswith("You are given a report by a government agency.")
        assert text.endswith("Now, write a one-page summary of the report.\n\nSummary:")
        assert len(text) < len(full)
        # the middle of the report is what went missing
        middle = full[len(full) // 2 - 20 : len(full) // 2 + 20]
        assert middle not in text

    def test_context_and_question_split(self, tokenizer):
        task = get_task("hotpotqa")
        sample = task.load_samples(tokenizer, n=1, data_dir="fixtures")[0]
        prompt = task.build_prompt(sample, tokenizer, 100_000)
        context = tokenizer.decode(prompt.input_ids[: prompt.context_len])
        question = tokenizer.decode(prompt.input_ids[prompt.context_len :])
        assert question == task.question_text(sample)
        assert context.endswith(sample.fields["context"][-40:])

    def test_split_survives_truncation(self, tokenizer):
        task = get_task("passage_retrieval_en")  # question part: 190 tokens, whole prompt: 2989
        sample = task.load_samples(tokenizer, n=1, data_dir="fixtures")[0]
        prompt = task.build_prompt(sample, tokenizer, 600)
        question = tokenizer.decode(prompt.input_ids[prompt.context_len :])
        assert question == task.question_text(sample)
        assert 0 < prompt.context_len < len(prompt.input_ids)

    def test_question_cut_by_truncation_starts_at_the_cut(self, tokenizer):
        task = get_task("passage_retrieval_en")
        sample = task.load_samples(tokenizer, n=1, data_dir="fixtures")[0]
        prompt = task.build_prompt(sample, tokenizer, 300)  # keeps 150 tokens of the 190-token question
        assert prompt.context_len == 150
        assert task.question_text(sample).endswith(tokenizer.decode(prompt.input_ids[prompt.context_len :]))

    def test_chat_template_applied_after_truncation(self, chat_tokenizer):
        task = get_task("qasper")
        sample = task.load_samples(chat_tokenizer, n=1, data_dir="fixtures")[0]
        text = chat_tokenizer.decode(task.build_prompt(sample, chat_tokenizer, 150).input_ids)
        assert text.startswith("<s>[user] You are given a scientific article")
        assert text.endswith("\n\nAnswer:</s><s>[assistant] ")

    @pytest.mark.parametrize("name", ["trec", "samsum", "lcc"])
    def test_few_shot_and_code_tasks_skip_chat_template(self, chat_tokenizer, name):
        task = get_task(name)
        sample = task.load_samples(chat_tokenizer, n=1, data_dir="fixtures")[0]
        text = chat_tokenizer.decode(task.build_prompt(sample, chat_tokenizer, 100_000).input_ids)
        assert text == task.prompt_text(sample)
        assert "[assistant]" not in text

    def test_no_chat_exceptions_match_official_list(self):
        skipping = {name for name in ("trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p", "qasper",
                                      "gov_report", "passage_count") if not get_task(name).spec.use_chat_template}
        assert skipping == {"trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"}


class TestScoring:
    def test_first_line_only_for_few_shot_tasks(self, tmp_path, tokenizer):
        write_jsonl(tmp_path / "triviaqa.jsonl", [TRIVIAQA_RECORD])
        task = get_task("triviaqa")
        sample = task.load_samples(tokenizer, data_dir=tmp_path)[0]
        assert task.score("\nAvel\nQuestion: Where is Kelvy?\nAnswer: Dunmoor", sample) == 1.0
        # the reference is on line two: not scored
        assert task.score("I think\nAvel", sample) == 0.0

    def test_other_tasks_score_the_whole_prediction(self, tokenizer):
        task = get_task("qasper")
        sample = task.load_samples(tokenizer, n=2, data_dir="fixtures")[1]  # "What dataset do they evaluate on?"
        assert task.score("Well,\n" + sample.answers[0], sample) > 0.5

    def test_trec_classification_on_first_line(self, tokenizer):
        task = get_task("trec")
        sample = task.load_samples(tokenizer, n=1, data_dir="fixtures")[0]
        assert task.score(sample.answers[0] + "\nQuestion: What is it?\nType: Food", sample) == 1.0
        assert task.score("", sample) == 0.0

    def test_max_over_references(self, tmp_path, tokenizer):
        write_jsonl(tmp_path / "triviaqa.jsonl", [TRIVIAQA_RECORD])
        task = get_task("triviaqa")
        sample = task.load_samples(tokenizer, data_dir=tmp_path)[0]
        # vs "Avel": [avel, river] vs [avel] -> 2/3 ; vs "the Avel river": [avel, river] -> 1.0
        assert task.score("Avel river", sample) == 1.0

    def test_aggregate_is_percent_rounded(self, tokenizer):
        task = get_task("qasper")
        samples = task.load_samples(tokenizer, n=3, data_dir="fixtures")
        assert task.aggregate([1.0, 0.5, 0.0], samples) == {"score": 50.0}
        assert task.aggregate([1.0, 0.0, 0.0], samples) == {"score": 33.33}

    def test_longbench_e_buckets(self, tmp_path, tokenizer):
        lengths = [1000, 3999, 4000, 7999, 8000, 20000]
        write_jsonl(tmp_path / "qasper_e.jsonl",
                    [dict(TRIVIAQA_RECORD, length=length, _id=f"e{i}") for i, length in enumerate(lengths)])
        task = get_task("qasper_e")
        samples = task.load_samples(tokenizer, data_dir=tmp_path)
        result = task.aggregate([1.0, 0.0, 1.0, 1.0, 0.25, 0.0], samples)
        # overall (1 + 0 + 1 + 1 + .25 + 0) / 6 = 0.5417 ; buckets: [1, 0] -> 50, [1, 1] -> 100, [.25, 0] -> 12.5
        assert result == {"score": 54.17, "buckets": {"0-4k": 50.0, "4-8k": 100.0, "8k+": 12.5}}

    def test_empty_bucket_is_none(self, tmp_path, tokenizer):
        write_jsonl(tmp_path / "trec_e.jsonl", [dict(TRIVIAQA_RECORD, length=100)])
        task = get_task("trec_e")
        result = task.aggregate([1.0], task.load_samples(tokenizer, data_dir=tmp_path))
        assert result["buckets"] == {"0-4k": 100.0, "4-8k": None, "8k+": None}


class TestData:
    @pytest.mark.parametrize("name", ["qasper", "hotpotqa", "trec", "passage_retrieval_en", "lcc", "samsum",
                                      "gov_report"])
    def test_fixtures_are_valid_official_records(self, tokenizer, name):
        samples = get_task(name).load_samples(tokenizer, n=None, data_dir=FIXTURE_DIR)
        assert len(samples) == 6
        assert len({s.id for s in samples}) == 6
        for sample in samples:
            assert sample.answers and all(isinstance(a, str) for a in sample.answers)
            assert sample.fields["length"] == len(sample.fields["context"].split())

    def test_first_n_in_file_order(self, tmp_path, tokenizer):
        records = [dict(TRIVIAQA_RECORD, _id=f"r{i}") for i in range(5)]
        write_jsonl(tmp_path / "triviaqa.jsonl", records)
        samples = get_task("triviaqa").load_samples(tokenizer, n=3, data_dir=tmp_path)
        assert [s.id for s in samples] == ["r0", "r1", "r2"]

    def test_ids_without_official_id_are_stable(self, tmp_path, tokenizer):
        record = {k: v for k, v in TRIVIAQA_RECORD.items() if k != "_id"}
        write_jsonl(tmp_path / "triviaqa.jsonl", [record, record])
        ids = [s.id for s in get_task("triviaqa").load_samples(tokenizer, data_dir=tmp_path)]
        assert ids == ["triviaqa:1", "triviaqa:2"]

    def test_official_unzipped_layout(self, tmp_path, tokenizer):
        (tmp_path / "data").mkdir()
        write_jsonl(tmp_path / "data" / "triviaqa.jsonl", [TRIVIAQA_RECORD])
        assert len(get_task("triviaqa").load_samples(tokenizer, data_dir=tmp_path)) == 1

    def test_malformed_json_names_file_and_line(self, tmp_path, tokenizer):
        path = tmp_path / "triviaqa.jsonl"
        path.write_text(json.dumps(TRIVIAQA_RECORD) + "\n{not json\n", encoding="utf-8")
        with pytest.raises(DataError, match=rf"{path}:2: not valid JSON"):
            get_task("triviaqa").load_samples(tokenizer, data_dir=tmp_path)

    @pytest.mark.parametrize("change, message", [
        ({"answers": "Avel"}, "field 'answers' must be list"),
        ({"answers": []}, "non-empty list of strings"),
        ({"length": "16"}, "field 'length' must be int"),
        ({"all_classes": "Food"}, "all_classes"),
    ])
    def test_invalid_record_names_file_line_and_field(self, tmp_path, tokenizer, change, message):
        path = write_jsonl(tmp_path / "triviaqa.jsonl", [TRIVIAQA_RECORD, dict(TRIVIAQA_RECORD, **change)])
        with pytest.raises(DataError, match=rf"{path}:2: .*{message}"):
            get_task("triviaqa").load_samples(tokenizer, data_dir=tmp_path)

    def test_missing_field(self, tmp_path, tokenizer):
        record = {k: v for k, v in TRIVIAQA_RECORD.items() if k != "context"}
        path = write_jsonl(tmp_path / "triviaqa.jsonl", [record])
        with pytest.raises(DataError, match=rf"{path}:1: missing field 'context'"):
            get_task("triviaqa").load_samples(tokenizer, data_dir=tmp_path)

    def test_missing_local_file_is_unavailable_with_instructions(self, tmp_path, tokenizer):
        with pytest.raises(TaskUnavailable, match="load_dataset\\('THUDM/LongBench'"):
            get_task("musique").load_samples(tokenizer, data_dir=tmp_path)

    def test_task_without_fixture_is_unavailable(self, tokenizer):
        with pytest.raises(TaskUnavailable, match="no packaged fixture for LongBench task 'dureader'"):
            get_task("dureader").load_samples(tokenizer, data_dir="fixtures")

    def test_hub_offline_without_cache_is_unavailable(self, tmp_path, monkeypatch, tokenizer):
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
        with pytest.raises(TaskUnavailable, match="THUDM/LongBench"):
            get_task("narrativeqa").load_samples(tokenizer, n=1, data_dir=None)


def test_narrativeqa_keeps_the_official_prompt_typo():
    # THUDM/LongBench config/dataset2prompt.json (2e00731f) reads "asconcisely" twice; KVCache-Factory copies it
    from pytest_kvbench.tasks.longbench.config import PROMPTS

    assert PROMPTS["narrativeqa"].count("asconcisely") == 2 and "as concisely" not in PROMPTS["narrativeqa"]
