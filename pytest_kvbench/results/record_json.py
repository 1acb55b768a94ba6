"""The one serializer of records: the record's dataclasses to JSON-able dicts and back.

A record is typed in memory (results/record.py) and plain JSON on disk, in the ``pytest_kvbench_record``
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
    for key, how in plan.parts.items():
        if key in data:
            values[key] = _load(how, data[key], f"{path}.{key}")
    if plan.has_extra:
        values[EXTRA] = {key: value for key, value in data.items() if key not in plan.declared}
    missing = [name for name in plan.required if name not in values]
    if missing:
        raise RecordShapeError(f"{path} has no {', '.join(repr(m) for m in missing)}")
    return cls(**values)


class _FieldPlan(typing.NamedTuple):
    part: type | None  # a nested record dataclass
    item: type | None  # list[dataclass]: its item
    allows_none: bool


class _ClassPlan(typing.NamedTuple):
    plain: frozenset[str]  # fields taken as they are
    parts: dict[str, _FieldPlan]  # fields holding a nested part (or a list of them)
    declared: frozenset[str]  # every field but extra
    required: tuple[str, ...]  # fields without a default
    has_extra: bool


def _load(how: _FieldPlan, value: Any, path: str) -> Any:
    if how.part is not None:
        if value is None and how.allows_none:
            return None
        return from_json(how.part, value, path)
    if not isinstance(value, list):
        raise RecordShapeError(f"{path} must be a list, found {type(value).__name__}")
    return [from_json(how.item, v, f"{path}[{i}]") for i, v in enumerate(value)]


@functools.cache
def _plan(cls: type) -> _ClassPlan:
    """How to read each field of ``cls``, worked out once per class from its type hints (records are
    read by the thousand)."""
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    plans = {f.name: _FieldPlan(_part_type(hints[f.name]), _list_item_part(hints[f.name]),
                                _allows_none(hints[f.name])) for f in fields if f.name != EXTRA}
    parts = {name: how for name, how in plans.items() if how.part is not None or how.item is not None}
    required = tuple(f.name for f in fields if _default(f) is dataclasses.MISSING)
    return _ClassPlan(frozenset(plans) - frozenset(parts), parts, frozenset(plans), required,
                      any(f.name == EXTRA for f in fields))


def _members(hint: Any) -> tuple:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def _allows_none(hint: Any) -> bool:
    return type(None) in _members(hint)


def _part_type(hint: Any) -> type | None:
    parts = [m for m in _members(hint) if isinstance(m, type) and dataclasses.is_dataclass(m)]
    return parts[0] if parts else None


def _list_item_part(hint: Any) -> type | None:
    for member in _members(hint):
        if typing.get_origin(member) is list:
            (item,) = typing.get_args(member) or (None,)
            return item if isinstance(item, type) and dataclasses.is_dataclass(item) else None
    return None
