"""Health checks that keep a long sweep going: non-finite logits, out of memory, time limits."""

from __future__ import annotations

import gc
import signal
import threading
import weakref

import pytest
import torch

from pytest_kvbench.engine import out_of_memory
from pytest_kvbench.engine.finite_logits import NonFiniteLogits, check_logits_finite
from pytest_kvbench.engine.out_of_memory import (
    ItemOutOfMemory,
    fail_on_out_of_memory,
    free_accelerator_memory,
    is_out_of_memory,
)
from pytest_kvbench.engine.time_limit import ItemTimeout, item_time_limit

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

# ---------------------------------------------------------------------------- logits


def test_finite_logits_pass():
    check_logits_finite(torch.randn(2, 5, 11), "prefill")
    check_logits_finite(torch.zeros(3, dtype=torch.bfloat16), "decode step 1")


def test_nan_and_inf_fail_with_where_and_how_many():
    logits = torch.zeros(1, 4, 10)
    logits[0, 2, 3] = float("nan")
    logits[0, 2, 5] = float("nan")
    logits[0, 3, 0] = float("-inf")
    with pytest.raises(NonFiniteLogits) as info:
        check_logits_finite(logits, "decode step 7 of qasper sample 12")
    message = str(info.value)
    assert "decode step 7 of qasper sample 12" in message
    assert "2 NaN and 1 inf among 40 values" in message
    assert "first at index (0, 2, 3)" in message
    assert isinstance(info.value, AssertionError)  # the item fails, it does not error


def test_a_sum_that_overflows_is_not_a_non_finite_logit():
    """The happy path sums the logits; finite values whose sum overflows (float16: 120,000 > 65,504) still pass."""
    check_logits_finite(torch.tensor([60000.0, 60000.0], dtype=torch.float16), "prefill")


@pytest.mark.parametrize("values", [[float("inf"), float("-inf"), 1.0], [0.0, float("inf")], [float("nan"), 2.0]])
def test_infinities_that_cancel_in_a_sum_still_fail(values):
    with pytest.raises(NonFiniteLogits, match="non-finite logits in decode"):
        check_logits_finite(torch.tensor(values), "decode")


def test_half_precision_overflow_is_caught():
    logits = torch.tensor([60000.0, 1.0], dtype=torch.float16) * 2  # overflows to inf
    with pytest.raises(NonFiniteLogits, match="dtype float16"):
        check_logits_finite(logits, "prefill")


# ---------------------------------------------------------------------------- out of memory


@pytest.mark.parametrize(
    "exc",
    [
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
        torch.cuda.OutOfMemoryError("CUDA out of memory."),
        RuntimeError("CUDA error: out of memory"),
        RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate memory"),
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"),
        MemoryError(),
    ],
)
def test_out_of_memory_errors_are_recognised(exc):
    assert is_out_of_memory(exc)


@pytest.mark.parametrize("exc", [RuntimeError("shape mismatch"), ValueError("out of memory"), KeyError("x")])
def test_other_errors_are_not_out_of_memory(exc):
    assert not is_out_of_memory(exc)


def test_a_wrapped_out_of_memory_error_is_recognised():
    try:
        try:
            raise torch.OutOfMemoryError("CUDA out of memory")
        except torch.OutOfMemoryError as inner:
            raise ValueError("generation failed") from inner
    except ValueError as outer:
        assert is_out_of_memory(outer)


def test_a_real_cpu_allocation_failure_is_recognised():
    with pytest.raises(RuntimeError) as info:
        torch.empty(2**62, dtype=torch.uint8)
    assert is_out_of_memory(info.value)


def test_free_accelerator_memory_collects_cycles_and_empties_the_cuda_cache(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))

    class Node:
        pass

    node = Node()
    node.self = node  # a reference cycle: only the garbage collector frees it
    node.tensor = torch.ones(10)
    alive = weakref.ref(node.tensor)
    del node
    gc.disable()
    try:
        free_accelerator_memory()
    finally:
        gc.enable()
    assert alive() is None
    assert emptied == [True]


def test_free_accelerator_memory_leaves_cuda_alone_on_cpu(monkeypatch):
    def must_not_run():
        raise AssertionError("empty_cache on a machine without CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "empty_cache", must_not_run)
    free_accelerator_memory()


def _forward_that_runs_out_of_memory(activations: list):
    hidden = torch.ones(1000)
    activations.append(weakref.ref(hidden))
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB\nmore detail")


def test_out_of_memory_fails_the_item_after_freeing_what_it_held(monkeypatch):
    emptied = []
    monkeypatch.setattr(out_of_memory, "free_accelerator_memory", lambda: emptied.append(activations[0]()))
    activations: list = []
    with pytest.raises(ItemOutOfMemory) as info:
        with fail_on_out_of_memory("qasper sample 3"):
            _forward_that_runs_out_of_memory(activations)
    assert str(info.value) == "out of memory in qasper sample 3: CUDA out of memory. Tried to allocate 20.00 GiB"
    assert isinstance(info.value, AssertionError)
    # The forward's activations were already released when memory was freed.
    assert emptied == [None]


def test_other_errors_pass_through_the_out_of_memory_guard():
    with pytest.raises(KeyError):
        with fail_on_out_of_memory("item"):
            raise KeyError("missing")
    with fail_on_out_of_memory("item"):
        pass


# ---------------------------------------------------------------------------- time limit


def _busy(iterations: int) -> int:
    total = 0
    for i in range(iterations):
        total += i
    return total


def test_time_limit_stops_a_runaway_item():
    with pytest.raises(ItemTimeout, match=r"qasper exceeded its time limit of 0.05 s \(--kvbench-timeout\)"):
        with item_time_limit(0.05, where="qasper") as limit:
            assert limit.enforced
            _busy(300_000_000)  # bounded: if the limit never fires, the test ends and fails
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_time_limit_raises_a_fresh_exception_whose_traceback_pytest_can_render():
    """The alarm's own traceback can hold a frame with no line number (CPython 3.11), which made pytest
    crash with INTERNALERROR while rendering it; the limit re-raises from its own exit instead."""
    limit = item_time_limit(3600, where="qasper")
    with pytest.raises(ItemTimeout, match="qasper exceeded its time limit") as info:
        with limit:
            limit._on_alarm(signal.SIGALRM, None)
    assert info.value.__suppress_context__
    assert isinstance(info.value.__context__, ItemTimeout)  # the alarm's exception, hidden from the report
    tb = info.value.__traceback__
    while tb is not None:
        assert tb.tb_lineno is not None
        tb = tb.tb_next
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_time_limit_restores_the_previous_handler_and_disarms():
    before = signal.getsignal(signal.SIGALRM)
    with item_time_limit(3600) as limit:
        assert limit.enforced
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is before


@pytest.mark.parametrize("seconds", [None, 0, -1])
def test_no_time_limit(seconds):
    with item_time_limit(seconds) as limit:
        pass
    assert not limit.enforced
    assert limit.reason == "no time limit set"


def test_time_limit_is_a_documented_no_op_off_the_main_thread():
    seen = {}

    def run():
        with item_time_limit(0.01) as limit:
            seen["enforced"], seen["reason"] = limit.enforced, limit.reason

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == {"enforced": False, "reason": "signals can only be handled in the main thread"}


def test_time_limit_leaves_an_earlier_firing_timer_alone():
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *a: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 600)
        with item_time_limit(3600) as limit:
            assert not limit.enforced
            assert "earlier SIGALRM timer" in limit.reason
        assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 600
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_time_limit_rearms_a_later_firing_timer_on_exit():
    previous = signal.signal(signal.SIGALRM, lambda *a: None)
    try:
        signal.setitimer(signal.ITIMER_REAL, 7200)
        with item_time_limit(60) as limit:
            assert limit.enforced
            assert signal.getitimer(signal.ITIMER_REAL)[0] <= 60
        assert 60 < signal.getitimer(signal.ITIMER_REAL)[0] <= 7200
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
