"""User methods in the grid, and health checks: NaN logits, out of memory, per-item time limit."""

import pytest

from helpers import HOOK_CONFTEST, hook_records, run_bench

METHODS_CONFTEST = HOOK_CONFTEST + '''
from dataclasses import dataclass

import torch
from kvmethods import Method, param, register_method
from kvmethods.scorers.scoring import protect_last


@register_method
@dataclass
class ValueNorm(Method):
    """A user's method: keep the largest value norms plus the most recent tokens."""
    name = "vnorm"
    recent: int = param(4, "recent tokens kept", minimum=0)

    def score(self, layer, n_keep):
        return protect_last(layer.values.float().norm(dim=-1), min(self.recent, n_keep))


@register_method
@dataclass
class Poison(Method):
    """A broken method: it writes NaN into the cache it should only read."""
    name = "poison"

    def score(self, layer, n_keep):
        layer.values.fill_(float("nan"))
        return layer.values.float().sum(-1).nan_to_num(0.0)


@register_method
@dataclass
class Greedy(Method):
    """A method that runs out of accelerator memory."""
    name = "greedy"

    def score(self, layer, n_keep):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
'''

# a task the default model answers with several tokens, so that decoding reads the poisoned cache
GRID = ["--kvbench-tasks", "niah_single_1", "--kvbench-context-lengths", "512", "--kvbench-budgets", "16",
        "--kvbench-samples", "1"]


@pytest.fixture(scope="module")
def health_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("health")
    (work / "conftest.py").write_text(METHODS_CONFTEST)
    proc = run_bench(work, *GRID, "--kvbench-methods", "greedy,vnorm:recent=8,poison,streamingllm",
                     "--kvbench-results", str(work / "res"))
    return work, proc


def test_a_user_registered_method_is_collected_and_run(health_run):
    work, proc = health_run
    records = {c["record"]["item_id"]: c["record"] for c in hook_records(work)}
    record = records["vnorm(recent=8)-16-niah_single_1-ctx512"]
    assert record["status"] == "passed"
    assert record["method"] == {"name": "vnorm", "params": {"recent": 8}}
    assert max(record["samples"][0]["kept_tokens_per_layer"]) <= 16


def test_nan_logits_fail_the_item_with_a_clear_message(health_run):
    work, proc = health_run
    records = {c["record"]["item_id"]: c["record"] for c in hook_records(work)}
    poisoned = records["poison-16-niah_single_1-ctx512"]
    assert poisoned["status"] == "error"
    assert "NaN" in poisoned["message"] and "poison-16-niah_single_1-ctx512" in poisoned["message"]


def test_out_of_memory_fails_the_item_and_the_worker_goes_on(health_run):
    work, proc = health_run
    records = {c["record"]["item_id"]: c["record"] for c in hook_records(work)}
    assert "out of memory" in records["greedy-16-niah_single_1-ctx512"]["message"]
    assert records["streamingllm-16-niah_single_1-ctx512"]["status"] == "passed"
    assert "2 failed, 2 passed" in proc.stdout


def test_the_per_item_time_limit_fails_a_slow_item(tmp_path):
    proc = run_bench(tmp_path / "w", *GRID, "--kvbench-methods", "full", "--kvbench-timeout", "0.001",
                     "--kvbench-results", str(tmp_path / "res"))
    assert proc.returncode == 1
    (call,) = hook_records(tmp_path / "w")
    assert call["record"]["status"] == "error"
    assert "time limit" in call["record"]["message"].lower() or "timeout" in call["record"]["message"].lower()
