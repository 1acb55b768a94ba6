"""One spelling per grid value, so that one measurement is one item.

``--kvbench-methods snapkv,snapkv`` or budgets ``128,0128`` used to make identical items with
suffixed ids, run twice and tabulated twice. Every value is brought to its canonical spelling
(options.py keeps parsed Budgets, whose ``spec`` is canonical; kvmethods.spec respells method specs
with the parameters as the method coerces them) and repeats are dropped, the first spelling winning.
Models whose item-id labels would collide are refused instead: they are different models that ids
could not tell apart.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

from pytest_kvbench.cases import GridError, MethodSpec, model_label
from pytest_kvbench.wiring.grid.model_refs import is_local_reference

T = TypeVar("T")


def unique(values: Iterable[T], key: Callable[[T], Hashable] = lambda v: v) -> list[T]:
    """``values`` without repeats (by ``key``), in first-seen order."""
    seen: set = set()
    out = []
    for value in values:
        k = key(value)
        if k not in seen:
            seen.add(k)
            out.append(value)
    return out


def method(spec: MethodSpec, name: str, params: dict) -> tuple[MethodSpec, Hashable]:
    """The spec in its canonical spelling (kvmethods.spec: `name` is the method's own, a composition's parts
    in role order, ``kivi+snapkv`` is ``snapkv+kivi``; values as the method coerced them, `params`) and the
    key of what it measures.

    Two specs measure the same thing when every parameter ends up equal (``snapkv`` and
    ``snapkv:window=32`` when 32 is the default), unless one pins the seed that the other
    takes from the run.
    """
    pins_seed = "seed" in spec
    return spec.respelled(name, params), (name, tuple(sorted((k, repr(v)) for k, v in params.items())), pins_seed)


def model_key(model: str) -> str:
    """The same local directory however it is spelled; hub ids as given."""
    if is_local_reference(model):
        return os.path.normpath(os.path.abspath(os.path.expanduser(model)))
    return model


def models(names: Iterable[str]) -> list[str]:
    """Repeats dropped; two models that item ids would label alike are refused."""
    out = unique(names, model_key)
    labels: dict[str, str] = {}
    for name in out:
        label = model_label(name)
        if label in labels:
            raise GridError(f"models {labels[label]!r} and {name!r} would both be labelled {label!r} in item ids; "
                            f"give them directories with different names")
        labels[label] = name
    return out
