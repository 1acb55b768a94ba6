"""A method's parameters as declarations, and the one validation of given values against them.

Kept apart from base.py (which needs torch) so that a grid can be validated from the method catalog
(catalog.py) without importing any method implementation: `Method.__post_init__` and the catalog run the
same `validated()` over the same `ParamSpec`s, so a value is refused with the same message either way.
Values from the CLI grid arrive as strings and are coerced by the declared type, so `window="32"` works and
`window="wide"` is a MethodError naming the parameter and its type.
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import MethodError

INT64_MAX = 2**63 - 1
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def param(default: Any, help: str, *, choices: tuple | None = None, minimum: float | None = None,
          maximum: float | None = None, odd: bool = False):
    """A method parameter: a dataclass field whose metadata drives validation and error messages
    (`maximum`: the value must lie in [minimum, maximum]; `odd`: an odd integer, e.g. a pooling kernel)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum,
                                                        "maximum": maximum, "odd": odd})


@dataclass(frozen=True)
class ParamSpec:
    """One declared parameter: what `param(...)` says about a dataclass field, as plain data."""

    name: str
    kind: type
    default: Any
    help: str = ""
    choices: tuple | None = None
    minimum: float | None = None
    maximum: float | None = None
    odd: bool = False

    def describe(self) -> str:
        """`pooling:str=avgpool (avgpool|maxpool)`, for error messages: the choices only, never the bounds (the
        error messages and their tests name parameters this way)."""
        text = f"{self.name}:{self.kind.__name__}={self.default}"
        return text + (f" ({self.value_range()})" if self.choices else "")

    def value_range(self) -> str | None:
        """The values the parameter accepts beyond its type: its choices, bounds, parity (None: any of its type)."""
        if self.choices:
            return "|".join(self.choices)
        parts = []
        if self.maximum is not None:
            parts.append(f"[{self.minimum or 0:g}, {self.maximum:g}]")
        elif self.minimum is not None:
            parts.append(f">= {self.minimum:g}")
        if self.odd:
            parts.append("odd")
        return ", ".join(parts) or None


def declared_params(cls: type) -> tuple[ParamSpec, ...]:
    """The ParamSpecs of a method dataclass, in field order."""
    hints = typing.get_type_hints(cls)
    return tuple(ParamSpec(f.name, hints[f.name], f.default, f.metadata.get("help", ""), f.metadata.get("choices"),
                           f.metadata.get("minimum"), f.metadata.get("maximum"), f.metadata.get("odd", False))
                 for f in dataclasses.fields(cls))


def describe_params(specs: Sequence[ParamSpec]) -> str:
    """`window:int=32, pooling:str=avgpool (avgpool|maxpool)`: the valid parameters in an error message."""
    return ", ".join(spec.describe() for spec in specs) if specs else "(none)"


def check_known(method: str, specs: Sequence[ParamSpec], given: Mapping[str, Any]) -> None:
    """MethodError naming the first unknown parameter and the valid ones."""
    unknown = sorted(set(given) - {spec.name for spec in specs})
    if unknown:
        raise MethodError(f"{method}: unknown parameter {unknown[0]!r}; valid parameters: {describe_params(specs)}")


def checked_value(method: str, spec: ParamSpec, value: Any) -> Any:
    """`value` coerced to the declared type, checked against its choices and minimum."""
    value = coerce(method, spec.name, spec.kind, value)
    if spec.choices and value not in spec.choices:
        raise MethodError(f"{method}: parameter {spec.name!r} must be one of {'|'.join(spec.choices)}, got {value!r}")
    if spec.minimum is not None and value < spec.minimum:
        raise MethodError(f"{method}: parameter {spec.name!r} must be >= {spec.minimum}, got {value!r}")
    return value


def check_shape(method: str, spec: ParamSpec, value: Any) -> None:
    """The constraints a method used to check in its own check(), after every field is coerced: an upper
    bound, an odd kernel."""
    if spec.maximum is not None and value > spec.maximum:
        raise MethodError(f"{method}: parameter {spec.name!r} must be in [{spec.minimum or 0:g}, {spec.maximum:g}], "
                          f"got {value}")
    if spec.odd and value % 2 == 0:
        raise MethodError(f"{method}: parameter {spec.name!r} must be odd, got {value}")


def checked_values(method: str, specs: Sequence[ParamSpec], values: Mapping[str, Any]) -> dict[str, Any]:
    """Every declared parameter's value (given or default): each coerced and checked in declaration order,
    then the bounds and parities; MethodError on the first bad one."""
    checked = {spec.name: checked_value(method, spec, values.get(spec.name, spec.default)) for spec in specs}
    for spec in specs:
        check_shape(method, spec, checked[spec.name])
    return checked


def validated(method: str, specs: Sequence[ParamSpec], given: Mapping[str, Any]) -> dict[str, Any]:
    """`checked_values` of the given parameters; MethodError first on an unknown one."""
    check_known(method, specs, given)
    return checked_values(method, specs, given)


def coerce(method: str, name: str, kind: type, value: Any) -> Any:
    """`value` as `kind` (int, float, str or bool), strings parsed; MethodError naming the parameter."""
    wrong = MethodError(
        f"{method}: parameter {name!r} must be {kind.__name__}, got {value!r} ({type(value).__name__})"
    )
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise wrong
    if isinstance(value, bool):
        raise wrong
    if kind in (int, float):
        if isinstance(value, int) or (kind is float and isinstance(value, float)):
            number = kind(value)
        elif isinstance(value, str) and value.isascii():  # int('١٢') and float('١.٥') read other scripts' digits
            try:
                number = kind(value.strip())
            except ValueError:
                raise wrong from None
        else:
            raise wrong
        if not math.isfinite(number):  # nan passes every bound check; inf is no setting
            raise MethodError(f"{method}: parameter {name!r} must be a finite number, got {value!r}")
        if kind is int and abs(number) > INT64_MAX:  # torch indexes and seeds with 64-bit integers
            raise MethodError(f"{method}: parameter {name!r} is out of range (a 64-bit integer: at most "
                              f"{INT64_MAX:,} in size), got {reprlib.repr(value)}")
        return number
    if kind is str:
        if isinstance(value, str):
            return value.strip()
        raise wrong
    raise MethodError(f"{method}: parameter {name!r} has unsupported type {kind!r} (use int, float, str or bool)")
