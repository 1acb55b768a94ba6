"""A reference group's members decoded in batches (engine/group_decode.py with --kvbench-decode-batch): the same
records as sequential decoding, each member's first sample decoded alone (its own decode speed), methods that
cannot batch alone, and an out-of-memory batch shrinks and re-decodes without losing a sample."""

from __future__ import annotations

import pytest
import torch

from kvmethods import Budget
from pytest_kvbench.cases import Grid, MethodSpec
from pytest_kvbench.engine import decode_batching
from pytest_kvbench.engine.decode_batching import AUTO, AUTO_CPU, DecodeBatching
from pytest_kvbench.engine.runner import Runner
from model_helpers import one_thread  # noqa: F401 - module-scoped autouse fixture

METHODS = ["snapkv", "pyramidkv", "h2o", "streamingllm", "adakv", "kvzip", "kivi", "tova", "snapkv+kivi", "rkv"]


def run_group(decode_batch, samples=3, methods=METHODS, patch=None):
    grid = Grid(methods=[MethodSpec(m) for m in ["full", *methods]], budgets=[Budget.parse("16")],
                tasks=["niah_multikey_2"], context_lengths=[256], samples=samples, data_dir="fixtures",
                max_prompt_tokens=320)
    cases = grid.cases("ruler", lambda task: "ruler")
    runner = Runner(grid, "run", decode_batch=decode_batch)
    runner.shared.plan(cases)
    if patch is not None:
        patch(runner)
    return runner, [runner.run(case) for case in cases]


@pytest.fixture(scope="module")
def both():
    return run_group(1, samples=4)[1], run_group(4, samples=4)


@pytest.fixture(scope="module")
def across():
    """Batches of up to 32 members: the 9 sharing members of samples 2 to 4 (3 x 9 <= 32) decode in the same batches."""
    return run_group(32, samples=4)


def assert_records_equal(sequential, batched):
    """Whole records equal, sample by sample, but for the decoding's timings and batch sizes (fidelity within
    the float rounding of a different batch shape)."""
    timed = {"decode_ms", "prefill_ms", "shared_prefill_ms", "compression_ms", "scoring_ms", "decode_batch",
             "decode_batch_samples"}
    approx = {"kl", "decode_kl"}
    assert [r.key for r in sequential] == [r.key for r in batched]
    for alone, together in zip(sequential, batched):
        assert together.n_samples == alone.n_samples == 4
        assert (together.score, together.aggregate) == (alone.score, alone.aggregate), together.key
        for a, b in zip(alone.samples, together.samples):
            assert set(a) - {"decode_batch_samples"} == set(b) - {"decode_batch_samples"}, together.key
            for field in set(a) - timed - approx:
                assert b[field] == a[field], f"{together.key} sample {a['id']}: {field}"
            for field in approx & set(a):
                assert b[field] == pytest.approx(a[field], abs=1e-3), f"{together.key} sample {a['id']}: {field}"
        assert together.fidelity.agreement == alone.fidelity.agreement
        assert (together.memory.kv_bytes_after, together.method) == (alone.memory.kv_bytes_after, alone.method)


def test_batched_records_equal_sequential_ones(both):
    sequential, (runner, batched) = both
    assert_records_equal(sequential, batched)


def test_members_of_several_samples_decode_in_one_batch_and_records_equal_sequential_ones(both, across):
    """Samples 2 to 4 (prompts of different lengths) decode together: one padded batch of their 3 x 7 dense and
    ragged members, one of their 3 x 2 quantized ones; every record equals the sequential run's."""
    sequential, _ = both
    runner, batched = across
    assert_records_equal(sequential, batched)
    by_method = {r.method.name: r for r in batched}
    assert len({row["prompt_tokens"] for row in by_method["snapkv"].samples[1:]}) == 3, "prompts of one length"
    for name in ["snapkv", "pyramidkv", "h2o", "streamingllm", "adakv", "kvzip", "tova"]:
        rows = by_method[name].samples
        assert (rows[0]["decode_batch"], rows[0]["decode_batch_samples"]) == (1, 1), name
        assert [(r["decode_batch"], r["decode_batch_samples"]) for r in rows[1:]] == [(21, 3)] * 3, name
    for name in ["kivi", "snapkv+kivi"]:
        assert [(r["decode_batch"], r["decode_batch_samples"]) for r in by_method[name].samples[1:]] == [(6, 3)] * 3
    assert runner.shared.waiting_count() == 0 and runner.batching.shrunk is None
    assert runner.references.computed == 4  # each sample's reference once, decoded in the window's prefills
    assert all(row["new_tokens"] > 0 for r in batched for row in r.samples if r.method.name != "rkv")


def fake_cuda(monkeypatch, free_bytes):
    """What the CPU cannot show: the members' caches on a CUDA device with `free_bytes` free; the calls counted."""
    calls = []

    def mem_get_info(device=None):
        calls.append(device)
        return free_bytes, 2 * free_bytes

    monkeypatch.setattr(decode_batching, "_device", lambda states: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)  # nothing cached unless a test says so
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    return calls


def test_auto_on_cuda_sizes_the_batch_and_the_window_from_the_free_memory(monkeypatch):
    """A member's share: its padded cache (2 heads x 8 tokens x 4 dims x K+V x 4 bytes = 512), room for 16 new
    tokens at 64 bytes each, its log-probs (4 bytes x 100 words x (16 steps + 2 x 16 targets)): 20,736 bytes;
    half the free memory goes to the batch."""
    calls = fake_cuda(monkeypatch, 10 * 20_736 * 2)
    states = [State() for _ in range(3)]
    batching = DecodeBatching(AUTO)
    assert batching.size(states, 16, 16, 100) == 10 and len(calls) == 1
    assert batching.samples_together(10, 3) == 3 and batching.samples_together(10, 11) == 1
    assert batching.out_of_memory(10) == 5 and batching.size(states, 16, 16, 100) == 5  # never above what failed
    fake_cuda(monkeypatch, 20_736)  # less than one member's share: still one
    assert DecodeBatching(AUTO).size(states, 16, 16, 100) == 1


def test_out_of_memory_across_samples_shrinks_the_batch_and_loses_no_sample(monkeypatch, both):
    """auto on a faked CUDA device with room for every member: samples 2 to 4 decode in the same batches (21 padded
    members); a batch of more than 8 members runs out of memory (torch.OutOfMemoryError), the limit halves
    (21 -> 10 -> 5), batches still span samples, and every record equals the sequential run's."""
    sequential, _ = both
    calls = fake_cuda(monkeypatch, 1 << 40)
    tried = []

    def patch(runner):
        decode = runner.prefills.compressed_batch

        def small_batches_only(jobs):
            tried.append((len(jobs), len({job.group.sample_id for job in jobs})))
            if len(jobs) > 8:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return decode(jobs)

        runner.prefills.compressed_batch = small_batches_only

    runner, batched = run_group(AUTO, samples=4, patch=patch)
    assert calls and tried[0] == (21, 3) and runner.batching.limit == 5
    assert runner.batching.shrunk == "decode batch shrank from 21 to 5 members after out of memory"
    assert any(samples > 1 for size, samples in tried if size <= 8)
    assert_records_equal(sequential, batched)
    assert runner.shared.waiting_count() == 0


def test_a_later_samples_prefill_that_fails_ends_the_window_and_loses_no_sample(both):
    """The window's third prefill (sample 4, after samples 2 and 3) runs out of memory: the window ends there (the
    limit halves, 27 -> 13 members: one group of 9 a batch), sample 4 is prefilled again when the items reach it, and
    every record equals the sequential run's."""
    sequential, _ = both
    calls, failed = [], []

    def patch(runner):
        prefill = runner.prefills.prefill

        def third_fails(*args):
            calls.append(args)
            if len(calls) == 4:  # sample 1 (alone), then the window: samples 2, 3, 4
                failed.append(args)
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return prefill(*args)

        runner.prefills.prefill = third_fails

    runner, batched = run_group(32, samples=4, patch=patch)
    assert failed and runner.batching.limit == 13 and len(calls) == 5
    assert_records_equal(sequential, batched)
    sizes = [(r["decode_batch"], r["decode_batch_samples"]) for r in {r.method.name: r for r in batched}["snapkv"].samples]
    assert sizes[1:3] == [(13, 2), (13, 2)] and sizes[3][1] == 1  # samples 2 and 3 together (13 of their 14 rows)


def test_each_member_decodes_its_first_sample_alone_and_the_rest_in_batches(both):
    _, (runner, batched) = both
    by_method = {r.method.name: r for r in batched}
    for name in ["snapkv", "pyramidkv", "h2o", "streamingllm", "adakv", "kvzip", "tova"]:
        sizes = [row["decode_batch"] for row in by_method[name].samples]
        assert sizes[0] == 1 and all(1 < size <= 4 for size in sizes[1:]), (name, sizes)
        assert {row["decode_batch_samples"] for row in by_method[name].samples} == {1}  # 4 < 10 members: no window
        latency = by_method[name].latency
        assert latency.decode_tokens_per_s_alone is not None and latency.decode_tokens_per_s_alone > 0
    for name in ["kivi", "snapkv+kivi"]:  # quantized: a batch of their own
        assert [row["decode_batch"] for row in by_method[name].samples] == [1, 2, 2, 2], name
    assert "decode_batch" not in by_method["rkv"].samples[0]  # compresses while decoding: prefilled and decoded alone
    assert by_method["full"].latency.decode_tokens_per_s_alone == by_method["full"].latency.decode_tokens_per_s
    assert runner.batching.shrunk is None and all(r.latency.decode_batch_note is None for r in batched)


def test_an_out_of_memory_batch_shrinks_and_loses_no_sample():
    """Any batch of more than 2 members runs out of memory: the limit halves, the members are decoded again in
    batches of 2, every record is complete and equal to the sequential run's, and the note says so once."""
    sequential = run_group(1, samples=2, methods=METHODS[:5])[1]
    tried = []

    def patch(runner):
        decode = runner.prefills.compressed_batch

        def small_batches_only(jobs):
            tried.append(len(jobs))
            if len(jobs) > 2:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return decode(jobs)

        runner.prefills.compressed_batch = small_batches_only

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
        decode = runner.prefills.compressed_batch

        def h2o_fails(jobs):
            made = decode(jobs)
            return [ValueError("h2o's log-probs are not finite") if job.member.method.name == "h2o" else result
                    for job, result in zip(jobs, made)]

        runner.prefills.compressed_batch = h2o_fails

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


class State:
    """A prefilled state as DecodeBatching.size reads it: one layer of 2 KV heads x 8 tokens x 4 dims (float32)."""

    def __init__(self):
        layer = type("Layer", (), {"keys": torch.zeros(1, 2, 8, 4)})()
        self.cache = type("Cache", (), {"layers": [layer]})()
        self.next_position = 8


def test_auto_on_cpu_is_the_documented_default_and_a_number_is_a_limit(monkeypatch):
    states = [State() for _ in range(3)]
    assert DecodeBatching(AUTO).size(states, 16, 16, 100) == AUTO_CPU
    monkeypatch.setattr(decode_batching, "_host_available", lambda: 10 * 20_736 * 2)  # 20,736 bytes a member (below)
    assert DecodeBatching(AUTO).size(states, 16, 16, 100) == 10
    monkeypatch.undo()
    assert DecodeBatching(3).size(states, 16, 16, 100) == 3 and DecodeBatching(1).sequential
    batching = DecodeBatching(AUTO)
    assert batching.out_of_memory(40) == 20 and batching.size(states, 16, 16, 100) == 20


def test_a_failure_on_a_later_sample_of_a_window_raises_when_its_item_reaches_that_sample():
    """snapkv runs first (no full item planned) and hosts a window of samples 2 to 4 for itself, h2o and tova:
    snapkv's own failure on sample 3 and h2o's on samples 3 and 4 are raised when each reaches sample 3 (the
    earliest), after the samples before it were scored; tova, failing nowhere, completes."""
    grid = Grid(methods=[MethodSpec(m) for m in ["full", "snapkv", "h2o", "tova"]], budgets=[Budget.parse("16")],
                tasks=["niah_multikey_2"], context_lengths=[256], samples=4, data_dir="fixtures", max_prompt_tokens=320)
    cases = [case for case in grid.cases("ruler", lambda task: "ruler") if case.method.name != "full"]
    runner = Runner(grid, "run", decode_batch=32)
    runner.shared.plan(cases)
    decode = runner.prefills.compressed_batch

    def failing(jobs):
        made = decode(jobs)
        return [ValueError(f"{job.member.method.name} fails on sample {job.group.order + 1}")
                if job.group.order >= 2 and job.member.method.name in ("snapkv", "h2o")
                and (job.member.method.name == "h2o" or job.group.order == 2) else result
                for job, result in zip(jobs, made)]

    runner.prefills.compressed_batch = failing
    outcomes = {}
    for case in cases:
        done = []
        try:
            outcomes[case.method.name] = runner.run(case, lambda n, total, decoded=(), samples_decoded=0: done.append(n))
        except ValueError as exc:
            outcomes[case.method.name] = exc
        outcomes[case.method.name + " progress"] = done
    assert str(outcomes["snapkv"]) == "snapkv fails on sample 3" and outcomes["snapkv progress"] == [1, 2]
    assert str(outcomes["h2o"]) == "h2o fails on sample 3" and outcomes["h2o progress"] == [1, 2]
    assert any("raised in the run of" in note for note in outcomes["h2o"].__notes__)
    tova = outcomes["tova"]
    assert tova.n_samples == 4 and [r["decode_batch_samples"] for r in tova.samples] == [1, 3, 3, 3]
    assert runner.shared.waiting_count() == 0


def test_a_decoded_batchs_caches_are_freed_before_the_next_batch_decodes():
    """Batches of 2: when a batch starts, the prefilled caches of the batches decoded before it are gone (they
    were held until every batch of the sample was done, so later batches decoded beside every earlier cache)."""
    import gc
    import weakref

    earlier: list = []
    held_at_start: list[int] = []

    def patch(runner):
        decode = runner.prefills.compressed_batch

        def recording(jobs):
            gc.collect()
            held_at_start.append(sum(ref() is not None for ref in earlier))
            earlier.extend(weakref.ref(job.state) for job in jobs)
            return decode(jobs)

        runner.prefills.compressed_batch = recording

    run_group(2, samples=2, methods=METHODS[:5], patch=patch)
    assert len(held_at_start) >= 2 and held_at_start == [0] * len(held_at_start)


def test_auto_on_cuda_counts_the_memory_torch_holds_cached_but_unused(monkeypatch):
    """After a prefill torch's caching allocator keeps the freed activations reserved: the driver does not count
    them free (mem_get_info) though the batch can use them. 4 members' worth free + 6 cached unused = 10."""
    fake_cuda(monkeypatch, 4 * 20_736 * 2)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 9 * 20_736 * 2)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 3 * 20_736 * 2)
    assert DecodeBatching(AUTO).size([State() for _ in range(3)], 16, 16, 100) == 10


@pytest.mark.parametrize("measure_alone", ["item", "method"])
def test_a_methods_own_speed_is_measured_once_per_item_or_once_per_method(measure_alone):
    """--kvbench-measure-alone: `item` decodes each item's first sample alone; `method` only the first item's of
    each method and budget (the second task's items batch from their first sample), and those items record no
    speed of their own, which the table then leaves out of the method's Dec tok/s. The outputs are the same."""
    grid = Grid(methods=[MethodSpec(m) for m in ["full", "snapkv", "h2o", "streamingllm"]],
                budgets=[Budget.parse("16")], tasks=["niah_single_1", "niah_multikey_2"], context_lengths=[256],
                samples=3, data_dir="fixtures", max_prompt_tokens=320, measure_alone=measure_alone)
    cases = grid.cases("ruler", lambda task: "ruler")
    runner = Runner(grid, "run", decode_batch=4)
    runner.shared.plan(cases)
    records = {(r.task.name, r.method.name): r for r in (runner.run(case) for case in cases)}
    for method in ["snapkv", "h2o", "streamingllm"]:
        first, second = records[("niah_single_1", method)], records[("niah_multikey_2", method)]
        assert [row["decode_batch"] == 1 for row in first.samples] == [True, False, False], method
        assert first.latency.decode_tokens_per_s_alone is not None
        alone_in_second = [row["decode_batch"] == 1 for row in second.samples]
        if measure_alone == "item":
            assert alone_in_second == [True, False, False], method
            assert second.latency.decode_tokens_per_s_alone is not None
        else:
            assert alone_in_second == [False, False, False], method
            assert second.latency.decode_tokens_per_s_alone is None
            from pytest_kvbench.results.views.table_model import _batched
            assert _batched(second) and not _batched(records[("niah_single_1", "full")])
    if measure_alone == "method":
        items = Runner(Grid(**{**grid.__dict__, "measure_alone": "item"}), "run2", decode_batch=4)
        items.shared.plan(cases)
        same = {(r.task.name, r.method.name): r for r in (items.run(case) for case in cases)}
        assert {k: [row["prediction"] for row in r.samples] for k, r in records.items()} == \
               {k: [row["prediction"] for row in r.samples] for k, r in same.items()}
