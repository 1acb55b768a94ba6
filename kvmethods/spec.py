"""The method-spec grammar: the one parser and printer of what a grid, the CLI and the registry name.

Every place that reads or writes a method spec calls this module: the grid (command line, ini keys and
TOML tables), the item ids and records, the registry that builds a spec, the composition that routes its
parameters and the wrappers that hand theirs to a base. One grammar in one place keeps the spellings
from drifting apart, and it imports no torch (the plugin parses specs in every pytest run).

    spec   := name (":" key "=" value)*      snapkv:window=64:kernel=5
    name   := part ("+" part)*               snapkv+think+kivi: a composition (eviction, think, quantizer)
    part   := word (":" word)*               kvpress:SnapKVPress: leading parts without "=" are the name
    key    := word ("." word)*               kivi.bits: the part of a composition, or a press's inner press

An engine's own cache types are specs too (core/engine_caches.py): ``llamacpp:q8_0`` (keys and values) and
``llamacpp:k=q8_0:v=q4_0``; they run in the engine (pytest_kvbench/serving/), never in transformers.

A spec prints two ways: as text (`snapkv:kernel=5:window=64`, keys sorted), which parses back to the same
MethodSpec, and as the label of item ids and comparison keys (`snapkv(kernel=5,window=64)`). A wrapper
(`adakv`, `criticalkv`, `decoding`) names its base by `base=`; the parameters it does not declare belong
to the base (`MethodSpec.wrapping`). A composition's parameters go to the part that declares them, or
that their `part.` prefix names (`MethodSpec.routed`). The canonical spelling (`MethodSpec.respelled`)
writes every value as the method coerced it and a composition's parts in role order, so that one
measurement has one item id. Budgets (`128`, `r0.5`, `m0.25`) are `Budget` (core/budget.py), re-exported
here with the rest of the grammar.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .core.budget import Budget
from .core.catalog import BASE, KVPRESS_PREFIX, PER_TURN, PREFILL_CHUNK, SEPARATOR
from .core.engine_caches import is_engine_name
from .core.errors import MethodError
from .core.params import ParamSpec, coerce, describe_params

__all__ = ["BASE", "Budget", "MethodSpec", "spelling"]

_ASSIGN, _PAIRS, _PART = "=", ":", "."
# Parameters any evicting method takes; at their neutral value (false, 0) the method leaves them out of its own.
_ANY_METHOD = {PER_TURN: bool, PREFILL_CHUNK: int}


def spelling(value: Any) -> str:
    """How a parameter value prints: floats to 15 significant digits (0.0001, 1e-05), the rest as str."""
    return f"{value:.15g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class MethodSpec:
    """A method's name and the parameters the user set, keys sorted (the method fills in its defaults).
    Values are text when the spec came from text or a grid file, and what a caller passed otherwise."""

    name: str
    params: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, name: str, params: Mapping[str, Any] | None = None) -> MethodSpec:
        return cls(name.strip(), tuple(sorted((params or {}).items())))

    @classmethod
    def parse(cls, text: str) -> MethodSpec:
        """``snapkv`` or ``snapkv:window=64:kernel=5``; MethodError on a pair that is not ``key=value``, a key
        given twice or no name."""
        name, *pairs = text.strip().split(_PAIRS)
        while pairs and _ASSIGN not in pairs[0]:
            name += _PAIRS + pairs.pop(0)
        params: dict[str, str] = {}
        for pair in pairs:
            key, sep, value = (part.strip() for part in pair.partition(_ASSIGN))
            if not sep or not key or not value:
                raise MethodError(f"method parameter {pair!r} in {text!r} is not of the form name=value")
            if key in params:
                raise MethodError(f"method {text!r} sets {key!r} twice ({key}={params[key]} and {key}={value}); "
                                  f"give it once")
            params[key] = value
        if not name.strip():
            raise MethodError(f"method {text!r} has no name")
        return cls.of(name, params)

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> MethodSpec:
        """A grid file's table, ``{name = "snapkv", window = 64}``; a nested table (a kvpress wrapper's inner
        press) becomes dotted keys: ``press = {name = "X", w = 1}`` -> ``press=X``, ``press.w=1``."""
        if not isinstance(table.get("name"), str):
            raise MethodError(f"method table {dict(table)} has no name")
        return cls.of(table["name"], {key: str(value) for key, value in _flattened(table).items()})

    def __str__(self) -> str:
        """The text form, which parses back to this spec."""
        return _PAIRS.join([self.name, *(f"{key}{_ASSIGN}{spelling(value)}" for key, value in self.params)])

    @property
    def label(self) -> str:
        """The spec in item ids, comparison keys and tables: ``snapkv(kernel=5,window=64)``."""
        if not self.params:
            return self.name
        return f"{self.name}({','.join(f'{key}={spelling(value)}' for key, value in self.params)})"

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    def __contains__(self, key: str) -> bool:
        return any(name == key for name, _ in self.params)

    def __getitem__(self, key: str) -> Any:
        return self.param_dict[key]

    def without(self, key: str) -> MethodSpec:
        return MethodSpec(self.name, tuple(pair for pair in self.params if pair[0] != key))

    @property
    def is_composition(self) -> bool:
        return SEPARATOR in self.name

    @property
    def is_kvpress(self) -> bool:
        return self.name.startswith(KVPRESS_PREFIX)

    @property
    def is_engine(self) -> bool:
        """A serving engine's cache types (``llamacpp:q4_0``), run by the engine, not by transformers."""
        return is_engine_name(self.name)

    @property
    def parts(self) -> tuple[str, ...]:
        """A composition's part names as written (``kivi+snapkv`` -> kivi, snapkv); MethodError unless it has
        two or three non-empty parts."""
        names = tuple(part.strip() for part in self.name.split(SEPARATOR))
        if not 2 <= len(names) <= 3 or not all(names):
            raise MethodError(f"{self.name}: a composition is an eviction method, think and/or a quantizer, like "
                              f"'snapkv+kivi' or 'snapkv+think+kivi'")
        return names

    def wrapping(self, own: Collection[str], default_base: str) -> tuple[MethodSpec, MethodSpec]:
        """A wrapper's spec split in two: its own parameters (those in `own`, `base` included when given) and
        its base's spec (the `base` value, else `default_base`, with every other parameter)."""
        mine = {key: value for key, value in self.params if key in own}
        rest = {key: value for key, value in self.params if key not in own}
        base = str(mine.get(BASE, default_base)).strip()
        if base == self.name:
            raise MethodError(f"{self.name}: base {base!r} cannot wrap itself")
        return MethodSpec.of(self.name, mine), MethodSpec.of(base, rest)

    def routed(self, declared: Sequence[tuple[str, Sequence[ParamSpec]]]) -> tuple[MethodSpec, ...]:
        """A composition's parameters, each to the one part that declares it (`declared`: each part's name
        and parameters, in `parts` order) or that its ``part.`` prefix names: one spec per part."""
        names = [name for name, _ in declared]
        routed: list[dict[str, Any]] = [{} for _ in declared]

        def route(part: int, bare: str, key: str, value: Any) -> None:
            if bare in routed[part]:  # `window=32:snapkv.window=64`: one parameter given twice
                raise MethodError(f"{self.name}: parameter {names[part]}.{bare} is given twice "
                                  f"({routed[part][bare]} and {key}={value}); give it once")
            routed[part][bare] = value

        for key, value in self.params:
            prefix, dot, bare = key.partition(_PART)
            if dot:
                if prefix not in names:
                    raise MethodError(f"{self.name}: parameter {key!r} names no part of the composition "
                                      f"({', '.join(names)})")
                route(names.index(prefix), bare, key, value)
                continue
            owners = [i for i, (_, specs) in enumerate(declared) if key in {spec.name for spec in specs}]
            if len(owners) > 1:
                raise MethodError(f"{self.name}: parameter {key!r} belongs to several parts; write it as "
                                  + " or ".join(f"{names[i]}.{key}" for i in owners))
            if not owners:
                valid = "; ".join(f"{name}: {describe_params(specs)}" for name, specs in declared)
                raise MethodError(f"{self.name}: unknown parameter {key!r}; valid parameters: {valid}")
            route(owners[0], key, key, value)
        return tuple(MethodSpec.of(name, params) for name, params in zip(names, routed))

    def respelled(self, name: str, values: Mapping[str, Any]) -> MethodSpec:
        """The canonical spelling of this spec, given what the method made of it (`name`: a composition's
        parts in role order; `values`: every parameter as the method coerced it, a wrapper's base's under
        ``base_params``, a composition's prefixed by their part): the parameters the user set, each spelled
        as the method's value. Parameters a method passes on unparsed (a press's ``press.window_size``)
        keep their spelling."""
        if self.is_engine:  # llamacpp:k=q8_0:v=q8_0 is llamacpp:q8_0: the engine spec's own canonical spelling
            return MethodSpec.of(name, values)
        canonical_name = name if self.is_composition else self.name
        return MethodSpec.of(canonical_name, {key: spelling(self._value_of(values, key, given))
                                              for key, given in self.params})

    def _value_of(self, values: Mapping[str, Any], key: str, given: Any) -> Any:
        """The method's value of a parameter the user set: at the top, a wrapper's base's, or the one
        composition part's (``bits`` -> ``kivi.bits``)."""
        if key in values:
            return values[key]
        base_values = values.get("base_params") or {}
        if key in base_values:
            return base_values[key]
        in_parts = [value for name, value in values.items() if name.partition(_PART)[2] == key]
        if self.is_composition and len(in_parts) == 1:
            return in_parts[0]
        return coerce(self.name, key, _ANY_METHOD[key], given) if key in _ANY_METHOD else given


def _flattened(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in table.items():
        if not prefix and key == "name":
            continue
        if isinstance(value, Mapping):
            if "name" not in value:
                raise MethodError(f"nested method table {prefix}{key} has no name")
            flat[prefix + key] = value["name"]
            flat.update(_flattened({k: v for k, v in value.items() if k != "name"}, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat
