"""The one serializer of records: the record's dataclasses to JSON-able dicts and back.

A record is typed in memory (results/record/__init__.py) and plain JSON on disk, in the ``pytest_kvbench_record``
hook and in baseline files. Every conversion goes through ``to_json`` / ``from_json`` here, driven by the
dataclasses' own fields, so a field added to a part is written and read without touching this module.

Two rules keep files of other versions intact through a read and a write (``kvbench merge`` rewrites
records): a field marked ``OMITTED_AT_DEFAULT`` is left out while it holds its default (``message``,
``verdict``, a CPU device's ``memory_bytes``: fields older files never had), and keys a dataclass does
not declare are kept in its ``extra`` field and written back as they came.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, TypeVar

OMITTED_AT_DEFAULT = {"omitted_at_default": True}  # dataclasses.field(metadata=...): absent while at its default
EXTRA = "extra"  # the field that keeps the keys a part does not declare

T = TypeVar("T")


class RecordShapeError(ValueError):
    """A JSON value that cannot become the record part its field declares; the message names the path."""


def to_json(part: Any) -> dict:
    """The JSON-able dict of a record dataclass: declared fields in order, then its extra keys."""
    out: dict = {}
    for field in dataclasses.fields(part):
        if field.name == EXTRA:
            continue
        value = getattr(part, field.name)
        if field.metadata.get("omitted_at_default") and value == _default(field):
            continue
        out[field.name] = _dump(value)
    return out | dict(getattr(part, EXTRA, None) or {})


def _dump(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return to_json(value)
    if isinstance(value, list):
        return [_dump(v) for v in value]
    if isinstance(value, dict):
        return {k: _dump(v) for k, v in value.items()}
    return value


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def from_json(cls: type[T], data: object, path: str = "record") -> T:
    """``cls`` built from a JSON object: nested parts built from theirs, unknown keys into ``extra``.

    RecordShapeError (naming ``path``) when ``data`` or a nested part is not an object, or a field
    without a default is missing. Scalars are taken as they are: what a value must be is the reader's
    concern (``is_number``), as it was for the plain dicts."""
    if not isinstance(data, dict):
        raise RecordShapeError(f"{path} must be an object, found {type(data).__name__}")
    plan = _plan(cls)
    values = {key: value for key, value in data.items() if key in plan.plain}  # scalars, lists, dicts as they are
    for key, (part, allows_none) in plan.parts.items():
        if key in data:
            value = data[key]
            values[key] = None if value is None and allows_none else from_json(part, value, f"{path}.{key}")
    if plan.has_extra:
        values[EXTRA] = {key: value for key, value in data.items() if key not in plan.declared}
    missing = [name for name in plan.required if name not in values]
    if missing:
        raise RecordShapeError(f"{path} has no {', '.join(repr(m) for m in missing)}")
    return cls(**values)


class _ClassPlan(typing.NamedTuple):
    plain: frozenset[str]  # fields taken as they are: scalars, lists, dicts
    parts: dict[str, tuple[type, bool]]  # fields holding a nested part: (its dataclass, whether None is allowed)
    declared: frozenset[str]  # every field but extra
    required: tuple[str, ...]  # fields without a default
    has_extra: bool


@functools.cache
def _plan(cls: type) -> _ClassPlan:
    """How to read each field of ``cls``, worked out once per class from its type hints (records are
    read by the thousand)."""
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.name != EXTRA]
    parts = {}
    for field in fields:
        members = _members(hints[field.name])
        nested = [m for m in members if isinstance(m, type) and dataclasses.is_dataclass(m)]
        if nested:
            parts[field.name] = (nested[0], type(None) in members)
    declared = frozenset(f.name for f in fields)
    return _ClassPlan(declared - frozenset(parts), parts, declared,
                      tuple(f.name for f in fields if _default(f) is dataclasses.MISSING),
                      any(f.name == EXTRA for f in dataclasses.fields(cls)))


def _members(hint: Any) -> tuple:
    """The types of a hint: ``Latency | None`` -> (Latency, NoneType)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)
