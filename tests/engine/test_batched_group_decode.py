"""A reference group's members decoded in batches (engine/group_decode.py with --kvbench-decode-batch): the same
records as sequential decoding, each member's first sample decoded alone (its own decode speed), methods that
cannot batch alone, and an out-of-memory batch shrinks and re-decodes without losing a sample."""

from __future__ import annotations

import pytest
import torch

from kvmethods import Budget
from pytest_kvbench.cases import Grid, MethodSpec
from pytest_kvbench.engine.decode_batching import AUTO, AUTO_CPU, DecodeBatching
from pytest_kvbench.engine.runner import Runner
from model_helpers import one_thread  # noqa: F401 - module-scoped autouse fixture

METHODS = ["snapkv", "pyramidkv", "h2o", "streamingllm", "adakv", "kvzip", "kivi", "tova", "snapkv+kivi", "rkv"]


def run_group(decode_batch, samples=3, methods=METHODS, patch=None):
    grid = Grid(methods=[MethodSpec(m) for m in ["full", *methods]], budgets=[Budget.parse("16")],
                tasks=["niah_single_1"], context_lengths=[256], samples=samples, data_dir="fixtures",
                max_prompt_tokens=320)
    cases = grid.cases("ruler", lambda task: "ruler")
    runner = Runner(grid, "run", decode_batch=decode_batch)
    runner.shared.plan(cases)
    if patch is not None:
        patch(runner)
    return runner, [runner.run(case) for case in cases]


@pytest.fixture(scope="module")
def both():
    return run_group(1)[1], run_group(4)


def test_batched_records_equal_sequential_ones(both):
    sequential, (runner, batched) = both
    assert [r.key for r in sequential] == [r.key for r in batched]
    for alone, together in zip(sequential, batched):
        assert together.n_samples == alone.n_samples == 3
        for a, b in zip(alone.samples, together.samples):
            assert (b["prediction"], b["score"], b["new_tokens"]) == (a["prediction"], a["score"], a["new_tokens"]), \
                f"{together.key} sample {a['id']}"
            assert b["kv_bytes_after"] == a["kv_bytes_after"] and b["kept_tokens_per_head"] == a["kept_tokens_per_head"]
            assert b["kl"] == pytest.approx(a["kl"], abs=1e-3) and b["agreement"] == a["agreement"]


def test_each_member_decodes_its_first_sample_alone_and_the_rest_in_batches(both):
    _, (runner, batched) = both
    by_method = {r.method.name: r for r in batched}
    for name in ["snapkv", "pyramidkv", "h2o", "streamingllm", "adakv", "kvzip", "tova"]:
        sizes = [row["decode_batch"] for row in by_method[name].samples]
        assert sizes[0] == 1 and all(1 < size <= 4 for size in sizes[1:]), (name, sizes)
        latency = by_method[name].latency
        assert latency.decode_tokens_per_s_alone is not None and latency.decode_tokens_per_s_alone > 0
    for name in ["kivi", "snapkv+kivi"]:  # quantized: a batch of their own
        assert [row["decode_batch"] for row in by_method[name].samples] == [1, 2, 2], name
    assert "decode_batch" not in by_method["rkv"].samples[0]  # compresses while decoding: prefilled and decoded alone
    assert by_method["full"].latency.decode_tokens_per_s_alone == by_method["full"].latency.decode_tokens_per_s
    assert runner.batching.shrunk is None and all(r.latency.decode_batch_note is None for r in batched)


def test_an_out_of_memory_batch_shrinks_and_loses_no_sample():
    """Any batch of more than 2 members runs out of memory: the limit halves, the members are decoded again in
    batches of 2, every record is complete and equal to the sequential run's, and the note says so once."""
    sequential = run_group(1, samples=2, methods=METHODS[:5])[1]
    tried = []

    def patch(runner):
        decode = runner._compressed_batch

        def small_batches_only(cases, states, *args):
            tried.append(len(cases))
            if len(cases) > 2:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return decode(cases, states, *args)

        runner._compressed_batch = small_batches_only

    runner, batched = run_group(8, samples=2, methods=METHODS[:5], patch=patch)
    assert tried[0] == 5 and set(tried[1:]) <= {1, 2} and 2 in tried
    assert runner.batching.limit == 2
    assert runner.batching.shrunk == "decode batch shrank from 5 to 2 members after out of memory"
    for alone, together in zip(sequential, batched):
        assert [row["prediction"] for row in together.samples] == [row["prediction"] for row in alone.samples]
    assert all(r.n_samples == 2 for r in batched)
    assert batched[-1].latency.decode_batch_note == runner.batching.shrunk


def test_a_members_own_failure_in_a_batch_fails_that_member_only():
    def patch(runner):
        decode = runner._compressed_batch

        def h2o_fails(cases, states, *args):
            made = decode(cases, states, *args)
            return [ValueError("h2o's log-probs are not finite") if case.method.name == "h2o" else result
                    for case, result in zip(cases, made)]

        runner._compressed_batch = h2o_fails

    grid_methods = ["snapkv", "h2o", "tova"]
    grid = Grid(methods=[MethodSpec(m) for m in ["full", *grid_methods]], budgets=[Budget.parse("16")],
                tasks=["niah_single_1"], context_lengths=[256], samples=2, data_dir="fixtures", max_prompt_tokens=320)
    cases = grid.cases("ruler", lambda task: "ruler")
    runner = Runner(grid, "run", decode_batch=4)
    runner.shared.plan(cases)
    patch(runner)
    outcomes = []
    for case in cases:
        try:
            outcomes.append(runner.run(case))
        except ValueError as exc:
            outcomes.append(exc)
    full, snapkv, h2o, tova = outcomes
    assert isinstance(h2o, ValueError) and any("raised in the run of full" in n for n in h2o.__notes__)
    assert snapkv.n_samples == tova.n_samples == 2 and runner.shared.waiting_count() == 0


def test_auto_on_cpu_is_the_documented_default_and_a_number_is_a_limit():
    class State:
        def __init__(self):
            layer = type("Layer", (), {"keys": torch.zeros(1, 2, 8, 4)})()
            self.cache = type("Cache", (), {"layers": [layer]})()
            self.next_position = 8

    states = [State() for _ in range(3)]
    assert DecodeBatching(AUTO).size(states, 16, 16, 100) == AUTO_CPU
    assert DecodeBatching(3).size(states, 16, 16, 100) == 3 and DecodeBatching(1).sequential
    batching = DecodeBatching(AUTO)
    assert batching.out_of_memory(40) == 20 and batching.size(states, 16, 16, 100) == 20
