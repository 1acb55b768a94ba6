"""kvmethods.core.kernel_memo: in a shared prefill, a layer's budget-independent scoring runs once for all the
selections that need it, each gets its own copy, and its time is split among them."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from kvmethods import Budget, get_method
from kvmethods.core import kernel_memo
from kvmethods.core.kernel_memo import KernelMemo, layer_kernel
from kvmethods.runtime.shared_prefill import shared_prefill
from kvmethods.testing import tiny_model


class FakeClock:
    """perf_counter that advances only when a kernel says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_kernel_is_computed_once_and_every_caller_gets_its_own_copy():
    memo, calls = KernelMemo(), []

    def compute():
        calls.append(1)
        return torch.arange(4.0)

    memo.user = "a"
    first = memo.get(("k", 1), compute)
    first[0] = 99.0  # protect_last writes into its scores
    memo.user = "b"
    second = memo.get(("k", 1), compute)
    assert len(calls) == 1 and second.tolist() == [0.0, 1.0, 2.0, 3.0]
    memo.get(("k", 2), compute)  # other arguments: another entry
    assert len(calls) == 2


def test_the_seconds_of_an_entry_are_split_among_its_users(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(kernel_memo, "now", clock)  # the runtime clock (kvmethods/core/clock.py)
    memo = KernelMemo()

    def costing(seconds):
        def compute():
            clock.now += seconds
            return torch.zeros(1)
        return compute

    memo.user = 0
    memo.get("window", costing(6.0))
    memo.get("norms", costing(2.0))
    memo.user = 1
    memo.get("window", costing(6.0))
    memo.user = 2
    memo.get("window", costing(6.0))
    assert memo.computing_seconds(0) == 8.0 and memo.computing_seconds(1) == 0.0
    assert memo.shares() == {0: 2.0 + 2.0, 1: 2.0, 2: 2.0}


def test_without_a_memo_the_kernel_runs_every_time():
    calls = []

    @layer_kernel
    def kernel(layer, n):
        calls.append(n)
        return torch.zeros(n)

    class Layer:
        memo = None

    kernel(Layer(), 3)
    kernel(Layer(), 3)
    assert calls == [3, 3]


@pytest.mark.parametrize("names,kernel", [
    (["snapkv", "pyramidkv", "adakv", "criticalkv"], "window_attention"),
    (["h2o"], "accumulated_attention"),
    (["expected_attention"], "expected_attention_scores"),
])
def test_a_grid_scores_each_layer_once_per_kernel(monkeypatch, names, kernel):
    """Budgets 40 and 48 (of 80 tokens; over the 32-query window) of methods reading the same kernel: computed
    once per layer, used by all."""
    computed, used = Counter(), Counter()
    original = KernelMemo.get

    def spying(self, key, compute):
        (computed if key not in self._entries else used)[key[0]] += 1
        return original(self, key, compute)

    monkeypatch.setattr(KernelMemo, "get", spying)
    model = tiny_model("llama", seed=3)
    ids = [int(t) for t in torch.randint(5, 200, (80,), generator=torch.Generator().manual_seed(0))]
    requests = [(get_method(name), Budget.parse(budget)) for name in names for budget in ["40", "48"]]
    shared = shared_prefill(model, requests, ids, 70, "question_in_window")
    layers = model.config.num_hidden_layers
    assert all(error is None for error in shared.errors)
    assert computed[kernel] == layers
    assert computed[kernel] + used[kernel] == layers * len(requests)
    assert all(seconds > 0 for seconds in shared.own_s)  # each selection is booked its share
