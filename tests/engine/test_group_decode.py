"""A reference group decoded sample by sample (engine/group_decode.py): between samples a worker holds no
compressed cache, while a sample is in flight at most that sample's group of caches, and what goes wrong
while decoding another item's sample (an exception, out of memory, its time limit) fails that item only."""

from __future__ import annotations

import signal

import pytest
import torch

from kvmethods import Budget
from pytest_kvbench.cases import Grid, MethodSpec
from pytest_kvbench.engine.out_of_memory import ItemOutOfMemory
from pytest_kvbench.engine.runner import Runner
from pytest_kvbench.engine.sample_outcomes import DecodedSample, SharedPrefills
from pytest_kvbench.engine.time_limit import ItemTimeout, item_time_limit
from pytest_kvbench.results.record import MeterScope
from model_helpers import one_thread  # noqa: F401 - module-scoped autouse fixture
from kvmethods.testing import live_tensor_bytes, tensors_reachable

SHARING = ["snapkv", "h2o", "streamingllm", "tova"]


def runner_and_cases(methods: list[str], samples: int, timeout_s: float | None = None):
    """A runner planned with a full-cache item first, then one sharing item per method (budget 16)."""
    grid = Grid(methods=[MethodSpec(m) for m in ["full", *methods]], budgets=[Budget.parse("16")],
                tasks=["niah_single_1"], context_lengths=[256], samples=samples, data_dir="fixtures",
                max_prompt_tokens=320)
    cases = grid.cases("ruler", lambda task: "ruler")
    runner = Runner(grid, "run", timeout_s=timeout_s)
    runner.shared.plan(cases)
    return runner, cases


def live_bytes_beyond(runner: Runner, base: int) -> int:
    """Live tensor bytes beyond `base` (the model) and the run's fidelity references (cached by design)."""
    return live_tensor_bytes() - base - live_tensor_bytes(tensors_reachable(runner.references))


@pytest.fixture(scope="module")
def measured_run():
    """Full + 4 sharing items x 3 samples: live bytes after every sample and at the start of every
    compressed decoding, and the records."""
    runner, cases = runner_and_cases(SHARING, samples=3)
    loaded, _ = runner.models.get("default", runner.grid.dtype, runner.grid.attn_implementation)
    base = live_tensor_bytes()
    between, in_flight = [], []
    decode = runner.prefills.compressed

    def measured_decode(case, method, budget, task, sample, prompt, loaded, reference, prefilled=None):
        in_flight.append((sample.id, live_bytes_beyond(runner, base)))
        return decode(case, method, budget, task, sample, prompt, loaded, reference, prefilled)

    runner.prefills.compressed = measured_decode

    def progress(done, total, decoded=(), samples_decoded=0):
        between.append((live_tensor_bytes(tensors_reachable(runner.shared)), live_bytes_beyond(runner, base)))

    records = [runner.run(case, progress) for case in cases]
    return runner, loaded, records, between, in_flight


def test_between_samples_the_group_holds_no_cache_and_nothing_grows_with_the_samples(measured_run):
    runner, _, records, between, _ = measured_run
    assert [r.method.name for r in records] == ["full", *SHARING]
    assert len(between) == 5 * 3
    assert all(held == 0 for held, _ in between)  # SharedPrefills keeps outcomes only: no tensor at all
    first_live = between[0][1]
    assert all(live <= first_live for _, live in between)  # the same after 1 sample as after 15
    assert runner.shared.waiting_count() == 0


def test_while_a_sample_is_in_flight_at_most_its_groups_compressed_caches_are_live(measured_run):
    """At the start of every compressed decoding, live tensors beyond the model and the references are
    at most the compressed caches of that sample's group (keys, values, kept positions, first logits)."""
    _, loaded, records, _, in_flight = measured_run
    vocab = loaded.model.config.vocab_size
    group_bytes: dict[str, int] = {}
    for record in records[1:]:
        for row in record.samples:
            kept = sum(sum(heads) for heads in row["kept_tokens_per_head"])
            group_bytes[row["id"]] = group_bytes.get(row["id"], 0) + row["kv_bytes_after"] + 8 * kept + 4 * vocab
    assert len(in_flight) == len(SHARING) * 3  # every sample of every member decoded once, in the first item
    one_cache = min(group_bytes.values()) / len(SHARING)
    assert all(live <= group_bytes[sample_id] for sample_id, live in in_flight)
    assert max(live for _, live in in_flight) > one_cache  # the measure sees the group's caches


def test_the_meter_scope_says_whose_decoding_each_item_ran(measured_run):
    _, _, records, _, _ = measured_run
    full, *sharing = records
    assert full.meter_scope == MeterScope(decoded_for_other_items=len(SHARING) * 3, decoded_in_other_items=0)
    assert all(r.meter_scope == MeterScope(decoded_for_other_items=0, decoded_in_other_items=3) for r in sharing)
    for record in sharing:
        for row in record.samples:
            assert row["prefill_ms"] == pytest.approx(row["shared_prefill_ms"] + row["compression_ms"])
            assert row["decode_ms"] > 0


def failing_member_run(error: BaseException | None, timeout_s: float | None = None, time_left_s: float = 0.0):
    """Full, snapkv and h2o over 2 samples; h2o's decoding of sample 2 raises `error` (or, when `error` is
    None, runs until its time is up: time booked to h2o leaves it `time_left_s` of `timeout_s` for it).
    Returns the records or exceptions of each item, in order."""
    runner, cases = runner_and_cases(["snapkv", "h2o"], samples=2, timeout_s=timeout_s)
    h2o = cases[2]
    decode, calls = runner.prefills.compressed, []

    def failing_decode(case, method, budget, task, sample, prompt, loaded, reference, prefilled=None):
        calls.append(case.method.name)
        if error is None and calls.count("snapkv") == 2 and case.method.name == "snapkv":  # h2o's is next
            runner.shared.book(h2o, timeout_s - runner.shared.spent(h2o) - time_left_s)
        if case == h2o and calls.count("h2o") == 2:
            if error is None:
                _busy(300_000_000)  # bounded: if the limit never fires, the test ends and fails
            raise error
        return decode(case, method, budget, task, sample, prompt, loaded, reference, prefilled)

    runner.prefills.compressed = failing_decode
    outcomes = []
    for case in cases:
        try:
            outcomes.append(runner.run(case))
        except Exception as exc:  # noqa: BLE001 - what each item raised, checked by the test
            outcomes.append(exc)
    assert calls == ["snapkv", "h2o", "snapkv", "h2o"]  # every decoding ran in the full item's run
    return outcomes, runner


def test_an_exception_decoding_another_items_sample_fails_that_item_only():
    (full, snapkv, h2o), runner = failing_member_run(ValueError("h2o broke on sample 2"))
    assert full.n_samples == 2 and snapkv.n_samples == 2
    assert isinstance(h2o, ValueError) and str(h2o) == "h2o broke on sample 2"
    assert any("raised in the run of full-niah_single_1" in note for note in h2o.__notes__)
    assert runner.shared.waiting_count() == 0


def test_out_of_memory_decoding_another_items_sample_fails_that_item_only():
    (full, snapkv, h2o), _ = failing_member_run(torch.OutOfMemoryError("CUDA out of memory"))
    assert full.n_samples == 2 and snapkv.n_samples == 2
    assert isinstance(h2o, ItemOutOfMemory) and "out of memory in h2o-16-niah_single_1" in str(h2o)


def test_decoding_another_item_runs_on_that_items_clock():
    """The full item's 600 s timer is paused while h2o's decoding runs on h2o's time left (its limit less
    the time booked to it, here 0.05 s): h2o times out, the full item does not."""
    (full, snapkv, h2o), _ = failing_member_run(None, timeout_s=600.0, time_left_s=0.05)
    assert full.n_samples == 2 and snapkv.n_samples == 2
    assert isinstance(h2o, ItemTimeout)


def test_a_paused_limit_resumes_with_the_time_it_had_left():
    host = item_time_limit(3600, where="host")
    with host:
        with pytest.raises(ItemTimeout, match=r"member exceeded its time limit of 0.05 s"):
            with host.paused(0.05, "member"):
                _busy(300_000_000)  # bounded: if the limit never fires, the test ends and fails
        left = signal.getitimer(signal.ITIMER_REAL)[0]
    assert 3500 < left <= 3600  # the host's timer stood still meanwhile and runs on
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_shared_prefills_serve_only_planned_unfinished_items_and_free_what_an_item_leaves():
    _, (full, snapkv, h2o) = runner_and_cases(["snapkv", "h2o"], samples=1)
    shared = SharedPrefills()
    shared.plan([full, snapkv])  # h2o deselected (-k, --lf, a shard, resume): never computed
    assert shared.members(full, "s1") == [full, snapkv]
    shared.keep(snapkv, "s1", DecodedSample(None, 0.0, 1.0, {}, full.key))
    assert shared.members(full, "s1") == [full]  # snapkv has sample s1 already
    shared.fail(snapkv, "s2", ValueError("broken"))
    assert shared.members(full, "s2") == [full]  # a failed item gets nothing more
    assert shared.take(snapkv, "s1").host == full.key
    with pytest.raises(ValueError, match="broken"):
        shared.take(snapkv, "s2")
    shared.keep(snapkv, "s3", DecodedSample(None, 0.0, 1.0, {}, full.key))
    shared.finish(snapkv)
    assert shared.waiting_count() == 0 and shared.members(full, "s4") == [full]
    assert SharedPrefills(enabled=False).members(full, "s1") == [full]


def test_a_host_says_how_many_samples_its_decodes_since_last_asked_covered():
    """Batching across samples: the host's run decoded the members of three samples at once; the progress line
    counts them as three samples paid for (wiring/progress/eta.py), then the next sample's one."""
    _, (full, snapkv, h2o) = runner_and_cases(["snapkv", "h2o"], samples=1)
    shared = SharedPrefills()
    shared.plan([full, snapkv, h2o])
    for sample in ("s1", "s2", "s3"):
        for member in (snapkv, h2o):
            shared.keep(member, sample, DecodedSample(None, 0.0, 1.0, {"decode_batch": 6}, full.key))
    assert shared.decoded_batches(full) == (6,) * 6
    assert shared.decoded_samples(full) == 3
    assert shared.decoded_samples(full) == 0  # asked: nothing new
    shared.keep(snapkv, "s4", DecodedSample(None, 0.0, 1.0, {"decode_batch": 2}, full.key))
    assert shared.decoded_samples(full) == 1 and shared.decoded_samples(snapkv) == 0


def _busy(iterations: int) -> int:
    """Pure-Python work that a time limit can interrupt (no sleeps)."""
    return sum(range(iterations))
