"""Scoring kernels computed once per layer for all the selections of a shared prefill.

In a sweep, most of a layer's scoring does not depend on the budget: SnapKV and PyramidKV at four budgets
read the same window attention, H2O's accumulated attention and ExpectedAttention's scores are the same
whatever number of tokens is kept afterwards, and CriticalKV's value norms through o_proj too. When one
forward serves every (method, budget) of a grid (shared_prefill.py), the selections of a layer therefore
share one `KernelMemo`: the first selection that asks for a kernel computes it, the others get a copy
(callers may write into theirs, as `protect_last` does). Outside a shared prefill `LayerInputs.memo` is
None and every kernel runs as before, so results are the same bit for bit either way.

Time is booked honestly: the seconds spent computing an entry are split equally among the selections that
used it (`shares`), not charged to whichever came first.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import torch
from .clock import now


@dataclass
class _Entry:
    value: torch.Tensor
    seconds: float
    users: set = field(default_factory=set)


class KernelMemo:
    """Kernel results of one layer, keyed by (kernel, arguments), for the selections that share its inputs."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, _Entry] = {}
        self._computing: dict[Hashable, float] = defaultdict(float)  # user -> seconds spent computing entries
        self.user: Hashable = None  # the selection asking now

    def get(self, key: Hashable, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        entry = self._entries.get(key)
        if entry is None:
            started = now()
            value = compute()
            entry = self._entries[key] = _Entry(value, now() - started)
            self._computing[self.user] += entry.seconds
        entry.users.add(self.user)
        return entry.value.clone()

    def computing_seconds(self, user: Hashable) -> float:
        """Seconds `user` spent computing entries (to take out of its own time: `shares` books them)."""
        return self._computing.get(user, 0.0)

    def shares(self) -> dict[Hashable, float]:
        """Per user, its equal share of the seconds of every entry it used."""
        booked: dict[Hashable, float] = defaultdict(float)
        for entry in self._entries.values():
            for user in entry.users:
                booked[user] += entry.seconds / len(entry.users)
        return dict(booked)


def memoized(memo: KernelMemo | None, key: Hashable, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
    """compute(), or its copy from `memo` when the layer's selections share one."""
    return compute() if memo is None else memo.get(key, compute)


def layer_kernel(function: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Decorator for a kernel `function(layer, *args)` whose result depends only on the layer's inputs and
    the (hashable) args: memoized in `layer.memo` when the layer has one."""

    @functools.wraps(function)
    def kernel(layer, *args, **kwargs):
        key = (function.__qualname__, *args, *sorted(kwargs.items()))
        return memoized(layer.memo, key, lambda: function(layer, *args, **kwargs))

    return kernel
