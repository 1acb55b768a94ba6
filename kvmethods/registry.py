"""Name -> Method class: built-ins, the `kvbench.methods` entry-point group, and runtime registrations.

Third-party methods appear in the grid like built-in ones, either by an entry point
(`[project.entry-points."kvbench.methods"] mymethod = "mypkg.module:MyMethod"`) or by calling
`register_method` (usable as a decorator) from a conftest. A spec (kvmethods/spec.py) is built here:
`a+b` / `a+b+c` composes an eviction method with ThinK and/or a quantizer (composition.py),
`kvpress:<PressName>` names any press of the optional kvpress package (kvpress_adapter.py), and a
wrapper's base is built from the spec's base part and handed to the wrapper (score_wrapper.py). Entry points
are read on every lookup, so a package installed into the running environment is visible without
restarting anything.

Built-in methods are known by their catalog entries (catalog.py), so listing them and validating a spec
(`describe_method`) import no implementation, hence no torch; a method's module is imported when it is
built (`get_method`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .core.capabilities import Capability
from .core.catalog import BUILTINS, PER_TURN, PREFILL_CHUNK
from .core.engine_caches import engine_caches, is_engine_name
from .core.errors import MethodError
from .core.lazy_registry import LazyRegistry
from .core.params import declared_params, validated
from .spec import BASE, MethodSpec

if TYPE_CHECKING:
    from .core.base import Method

ENTRY_POINT_GROUP = "kvbench.methods"


def _check_method_class(cls: Any, origin: str) -> type[Method]:
    # lazy for startup time: base imports torch; only a registered or loaded class is checked
    from .core.base import Method, capability_mismatch

    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise MethodError(f"{origin}: {cls!r} is not a subclass of kvmethods.Method")
    if not cls.name or not cls.name.replace("_", "").replace("-", "").isalnum():
        raise MethodError(f"{origin}: {cls.__name__}.name must be a non-empty identifier-like string")
    mismatch = capability_mismatch(cls)
    if mismatch is not None:
        raise MethodError(f"{origin}: {cls.__name__} {mismatch}")
    return cls


# The built-ins are the catalog's rows ("role.module:Class", imported when built); the machinery is shared with the
# benchmark's tasks, named models and presets (core/lazy_registry.py)
METHODS: LazyRegistry[type[Method]] = LazyRegistry(
    "method", ENTRY_POINT_GROUP, lambda: {name: entry.target for name, entry in BUILTINS.items()},
    error=MethodError, check=_check_method_class)


def register_method(cls: type[Method] | None = None, *, name: str | None = None):
    """Register a Method subclass under `name` (default: cls.name). Works as `@register_method`,
    `@register_method(name=...)` or a plain call. Re-registering the same class is a no-op."""

    def add(target: type[Method]) -> type[Method]:
        if name is not None:
            target.name = name
        _check_method_class(target, "register_method")
        try:
            return METHODS.register(target.name, target)
        except MethodError as error:
            raise MethodError(f"register_method: {error}") from None

    return add if cls is None else add(cls)


def unregister_method(name: str) -> None:
    """Remove a runtime registration (tests, interactive sessions)."""
    METHODS.unregister(name)


def available_methods() -> list[str]:
    return METHODS.names()


def _load(name: str) -> type[Method]:
    loaded = METHODS.get(name)
    if name not in BUILTINS and loaded.name != name:
        raise MethodError(f"{METHODS.origin(name)}: class name attribute is {loaded.name!r}, expected {name!r}")
    return loaded


def get_method(name: str, **params: Any) -> Method:
    """An instance of the named method with the given parameters (strings are coerced by field type)."""
    if not isinstance(name, str):
        raise MethodError(f"method name must be a string, got {name!r}")
    if is_engine_name(name):
        raise MethodError(f"{name}: a serving engine's cache type runs in the engine (pytest_kvbench/serving/), "
                          f"not as a transformers method")
    return build(MethodSpec.of(name, params))


def build(spec: MethodSpec) -> Method:
    """The method a spec names: per_turn and prefill_chunk around any evicting method, a composition's parts,
    a kvpress press, or one method; a wrapper gets its base built here from the spec's base part."""
    # lazy for startup time: these build on base.py, which imports torch; listing and validating must not
    from .wrappers.chunked import chunked
    from .wrappers.composition import compose
    from .wrappers.per_turn import per_turn
    from .wrappers.score_wrapper import WrapperMethod

    if PER_TURN in spec:  # any evicting method: snapkv:per_turn=true re-compresses after each turn (per_turn.py)
        return per_turn(build(spec.without(PER_TURN)), spec[PER_TURN])
    if PREFILL_CHUNK in spec:  # any evicting method: snapkv:prefill_chunk=512 (chunked.py)
        return chunked(build(spec.without(PREFILL_CHUNK)), spec[PREFILL_CHUNK])
    if spec.is_composition:  # snapkv+kivi, snapkv+think+kivi: eviction, ThinK and/or a quantizer
        return compose(spec, _load, build)
    if spec.is_kvpress:
        from .adapters.kvpress_adapter import kvpress_method  # lazy: kvpress, an optional extra, only when a press is named

        return kvpress_method(spec.name, spec.param_dict)
    cls = _load(spec.name)
    if issubclass(cls, WrapperMethod):  # adakv:base=snapkv:window=64: the base gets what adakv does not declare
        declared = declared_params(cls)
        default_base = next(param.default for param in declared if param.name == BASE)
        own, base = spec.wrapping({param.name for param in declared}, default_base)
        return cls.around(build(base), **own.param_dict)
    return cls.from_params(**spec.param_dict)


@dataclass(frozen=True)
class MethodDescription:
    """What the grid needs of a valid method spec: its one name (a composition's parts in role order),
    every parameter's value as the method coerces it, and its capabilities (whether it re-compresses per
    turn, prefills alone: capabilities.prefills_alone)."""

    name: str
    params: dict[str, Any]
    capabilities: Capability  # the built method's (per_turn, chunks and wrapped bases included)


def describe_method(name: str, **params: Any) -> MethodDescription:
    """`get_method(name, **params)`'s name and parameters, with the same MethodError on a bad spec. A built-in
    whose parameters the catalog declares fully is checked there, importing nothing, and so is a built-in that
    wraps nothing and checks no environment, named without parameters (its defaults pass its own check():
    test_method_catalog.py), so that
    the default grid (kivi among its methods) is described without torch; any other spec (wrappers,
    compositions, per_turn, prefill_chunk, kvpress presses, third-party methods) is built."""
    if isinstance(name, str) and is_engine_name(name):  # llamacpp:q8_0: an engine's cache types (engine_caches.py)
        caches = engine_caches(name, params)
        return MethodDescription(caches.name, caches.params, Capability(0))
    entry = BUILTINS.get(name.strip()) if isinstance(name, str) else None
    if entry is not None and _described_by_row(entry, params):
        return MethodDescription(entry.name, validated(entry.name, entry.params, params), entry.capabilities)
    method = get_method(name, **params)
    return MethodDescription(method.name, method.params(), method.capabilities)


def _described_by_row(entry, params: dict[str, Any]) -> bool:
    """Whether the catalog row alone describes this spec exactly as building the class would."""
    if {PER_TURN, PREFILL_CHUNK} & set(params):
        return False
    return not entry.checked_in_code or (
        not params and Capability.WRAPS not in entry.capabilities and not entry.environment_check)
