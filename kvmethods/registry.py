"""Name -> Method class: built-ins, the `kvbench.methods` entry-point group, and runtime registrations.

Third-party methods appear in the grid like built-in ones, either by an entry point
(`[project.entry-points."kvbench.methods"] mymethod = "mypkg.module:MyMethod"`) or by calling
`register_method` (usable as a decorator) from a conftest. `a+b` / `a+b+c` composes an eviction method
with ThinK and/or a quantizer (composition.py). `kvpress:<PressName>` names any press of the
optional kvpress package (kvpress_adapter.py). Entry points are read on every lookup, so a
package installed into the running environment is visible without restarting anything.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from .adakv import AdaKV
from .base import Method
from .chunked import PARAMETER as PREFILL_CHUNK
from .chunked import chunked
from .composition import SEPARATOR, compose
from .criticalkv import CriticalKV
from .decoding_compression import DecodingCompression
from .errors import MethodError
from .expected_attention import ExpectedAttention
from .full import Full
from .h2o import H2O
from .hf_quantized import HFQuantized
from .kivi import KIVI
from .knorm import KNorm
from .kvzip import KVzip
from .per_turn import PARAMETER as PER_TURN
from .per_turn import per_turn
from .pyramidkv import PyramidKV
from .random import Random
from .rkv import RKV
from .snapkv import SnapKV
from .streamingllm import StreamingLLM
from .think import ThinK
from .tova import TOVA

ENTRY_POINT_GROUP = "kvbench.methods"
BUILTIN_METHODS: dict[str, type[Method]] = {
    cls.name: cls for cls in (Full, StreamingLLM, H2O, SnapKV, PyramidKV, TOVA, KNorm, Random, AdaKV, CriticalKV, ExpectedAttention, KVzip,
                KIVI, HFQuantized, ThinK,
                DecodingCompression, RKV)
}
_registered: dict[str, type[Method]] = {}


def _check_method_class(cls: Any, origin: str) -> type[Method]:
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise MethodError(f"{origin}: {cls!r} is not a subclass of kvmethods.Method")
    if not cls.name or not cls.name.replace("_", "").replace("-", "").isalnum():
        raise MethodError(f"{origin}: {cls.__name__}.name must be a non-empty identifier-like string")
    return cls


def register_method(cls: type[Method] | None = None, *, name: str | None = None):
    """Register a Method subclass under `name` (default: cls.name). Works as `@register_method`,
    `@register_method(name=...)` or a plain call. Re-registering the same class is a no-op."""

    def add(target: type[Method]) -> type[Method]:
        if name is not None:
            target.name = name
        _check_method_class(target, "register_method")
        existing = _registered.get(target.name) or BUILTIN_METHODS.get(target.name)
        if existing is not None and existing is not target:
            raise MethodError(f"register_method: a method named {target.name!r} already exists ({existing.__module__})")
        _registered[target.name] = target
        return target

    return add if cls is None else add(cls)


def unregister_method(name: str) -> None:
    """Remove a runtime registration (tests, interactive sessions)."""
    _registered.pop(name, None)


def _entry_point_methods() -> dict[str, Any]:
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}


def available_methods() -> list[str]:
    names = set(BUILTIN_METHODS) | set(_registered) | set(_entry_point_methods())
    return sorted(names)


KVPRESS_PREFIX = "kvpress:"


def _load(name: str) -> type[Method]:
    if name in BUILTIN_METHODS:
        return BUILTIN_METHODS[name]
    if name in _registered:
        return _registered[name]
    entry = _entry_point_methods().get(name)
    if entry is None:
        raise MethodError(f"unknown method {name!r}; valid methods: {', '.join(available_methods())}")
    origin = f"entry point {name!r} ({ENTRY_POINT_GROUP}: {entry.value})"
    try:
        loaded = entry.load()
    except Exception as error:  # a broken third-party package must not crash collection
        raise MethodError(f"{origin} failed to load: {type(error).__name__}: {error}") from error
    _check_method_class(loaded, origin)
    if loaded.name != name:
        raise MethodError(f"{origin}: class name attribute is {loaded.name!r}, expected {name!r}")
    return loaded


def get_method(name: str, **params: Any) -> Method:
    """An instance of the named method with the given parameters (strings are coerced by field type)."""
    if not isinstance(name, str):
        raise MethodError(f"method name must be a string, got {name!r}")
    name = name.strip()
    if PER_TURN in params:  # any evicting method: snapkv:per_turn=true re-compresses after each turn (per_turn.py)
        rest = {key: value for key, value in params.items() if key != PER_TURN}
        return per_turn(get_method(name, **rest), params[PER_TURN])
    if PREFILL_CHUNK in params:  # any evicting method: snapkv:prefill_chunk=512 (chunked.py)
        rest = {key: value for key, value in params.items() if key != PREFILL_CHUNK}
        return chunked(get_method(name, **rest), params[PREFILL_CHUNK])
    if SEPARATOR in name:  # snapkv+kivi, snapkv+think+kivi: eviction, ThinK and/or a quantizer
        return compose(name, params, _load)
    if name.startswith(KVPRESS_PREFIX):
        from .kvpress_adapter import kvpress_method  # imports kvpress only when a press is named

        return kvpress_method(name, params)
    return _load(name).from_params(**params)
