"""The task registry: names, suites, errors, context-length checks, cheap import."""

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_tasks_support import tiny_tokenizer

from pytest_kvbench import tasks
from pytest_kvbench.tasks import (
    DEFAULT_CONTEXT_LENGTH,
    TaskError,
    available_tasks,
    check_context_length,
    get_task,
)
from pytest_kvbench.wiring.grid.command_line import DEFAULT_TASKS, SMOKE_TASKS

LONGBENCH = ["narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique", "gov_report", "qmsum",
             "multi_news", "trec", "triviaqa", "samsum", "passage_count", "passage_retrieval_en", "lcc", "repobench-p",
             "multifieldqa_zh", "dureader", "vcsum", "lsht", "passage_retrieval_zh"]
LONGBENCH_E = ["qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "gov_report", "multi_news", "trec", "triviaqa",
               "samsum", "passage_count", "passage_retrieval_en", "lcc", "repobench-p"]
RULER = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3",
         "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"]


def test_all_official_tasks_are_registered():
    assert set(available_tasks("longbench")) == set(LONGBENCH) | {f"{t}_e" for t in LONGBENCH_E}
    assert set(RULER) | {"niah_grid", "niah_grid_essay"} == set(available_tasks("ruler"))
    assert len(available_tasks()) == 21 + 13 + 13 + 2 + 2 + 12 + 3 + 5  # + LongBench v2, InfiniteBench, reasoning, SCBench


def test_every_task_has_the_contract_attributes():
    for name in available_tasks():
        task = get_task(name)
        assert task.name == name and task.suite in tasks.SUITES
        assert isinstance(task.metric_name, str) and task.max_new_tokens > 0


def test_unknown_task_lists_valid_tasks_on_one_line():
    with pytest.raises(TaskError) as error:
        get_task("qaspr")
    message = str(error.value)
    assert "\n" not in message
    assert "did you mean 'qasper'" in message and "niah_single_1" in message and "lcc_e" in message


def test_unknown_suite():
    with pytest.raises(TaskError, match="valid suites: longbench, ruler, longbench_v2, infinitebench, reasoning, scbench"):
        available_tasks("babilong")


def test_errors_are_distinct_and_exported():
    assert issubclass(tasks.TaskError, ValueError) and issubclass(tasks.DataError, ValueError)
    assert not issubclass(tasks.DataError, tasks.TaskError)
    assert not issubclass(tasks.TaskUnavailable, (tasks.TaskError, tasks.DataError))
    from pytest_kvbench.tasks import errors

    assert errors.TaskUnavailable is tasks.TaskUnavailable


def test_smoke_and_default_tasks_load_offline_with_fixtures():
    assert DEFAULT_CONTEXT_LENGTH == 2048
    assert set(SMOKE_TASKS) <= set(DEFAULT_TASKS)
    tokenizer = tiny_tokenizer()
    for name in DEFAULT_TASKS:
        task = get_task(name)
        sample = task.load_samples(tokenizer, n=1, seed=0, data_dir=tasks.FIXTURE_DIR,
                                   context_length=DEFAULT_CONTEXT_LENGTH)[0]
        prompt = task.build_prompt(sample, tokenizer, DEFAULT_CONTEXT_LENGTH - task.max_new_tokens)
        assert 0 < prompt.context_len < len(prompt.input_ids)


class TestCheckContextLength:
    def test_within_the_model(self):
        check_context_length("niah_single_1", 4096, 4096)
        check_context_length(get_task("qasper"), None, 100_000)

    def test_beyond_the_model_names_its_maximum(self):
        with pytest.raises(TaskError, match="exceeds the model's maximum of 4096 tokens"):
            check_context_length("niah_single_1", 4096, 8192)

    def test_reads_the_maximum_from_a_model_or_tokenizer(self):
        model = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=2048))
        with pytest.raises(TaskError, match="maximum of 2048"):
            check_context_length("vt", model, 4096)
        tokenizer = SimpleNamespace(model_max_length=1024)
        with pytest.raises(TaskError, match="maximum of 1024"):
            check_context_length("vt", tokenizer, 2048)
        check_context_length("vt", SimpleNamespace(model_max_length=int(1e30)), 2048)  # "no limit" placeholder

    def test_no_room_for_the_generation(self):
        with pytest.raises(TaskError, match="generates 128 tokens"):
            check_context_length("niah_single_1", 4096, 100)


def test_import_and_lookup_load_no_heavy_library():
    code = (
        "import sys; import pytest_kvbench.tasks as t; "
        "[t.get_task(n) for n in t.available_tasks()]; "
        "print(sorted(m for m in ('jieba', 'rouge', 'datasets', 'rapidfuzz', 'scipy', 'transformers', 'torch', "
        "'wonderwords') if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
