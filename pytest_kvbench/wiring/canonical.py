"""One spelling per grid value, so that one measurement is one item.

``--kvbench-methods snapkv,snapkv`` or budgets ``128,0128`` used to make identical items with
suffixed ids, run twice and tabulated twice. Every value is brought to its canonical spelling
(options.py keeps parsed Budgets, whose ``spec`` is canonical; here method parameters as the
method coerces them) and repeats are dropped, the first spelling winning. Models whose item-id
labels would collide are refused instead: they are different models that ids could not tell apart.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

from pytest_kvbench.cases import GridError, MethodSpec, model_label
from pytest_kvbench.wiring.model_refs import is_local_reference

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


def method(spec: MethodSpec, params: dict, name: str) -> tuple[MethodSpec, Hashable]:
    """The spec with the method's own name (a composition's parts in role order: ``kivi+snapkv`` is
    ``snapkv+kivi``) and its parameter values as the method coerced them, and the key of what it measures.

    Two specs measure the same thing when every parameter ends up equal (``snapkv`` and
    ``snapkv:window=32`` when 32 is the default), unless one pins the seed that the other
    takes from the run.
    """
    canonical = MethodSpec(name, tuple(sorted((k, _spelling(_coerced(params, k, v))) for k, v in spec.params)))
    pins_seed = any(k == "seed" for k, _ in spec.params)
    return canonical, (name, tuple(sorted((k, repr(v)) for k, v in params.items())), pins_seed)


def _coerced(params: dict, name: str, given: object) -> object:
    """The method's own value of a parameter the grid set: at the top, or a wrapper's base parameter
    (``adakv:base=snapkv:window=16`` -> ``base_params``); parameters a method passes on unparsed
    (a kvpress press's ``press.window_size``) keep the grid's spelling."""
    if name in params:
        return params[name]
    return (params.get("base_params") or {}).get(name, given)


def _spelling(value: object) -> str:
    return f"{value:.15g}" if isinstance(value, float) else str(value)


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
