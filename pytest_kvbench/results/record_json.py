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
    declared = _fields(cls)
    values: dict = {}
    extra: dict = {}
    for key, value in data.items():
        if key in declared and key != EXTRA:
            values[key] = _load(declared[key], value, f"{path}.{key}")
        else:
            extra[key] = value
    if EXTRA in declared:
        values[EXTRA] = extra
    missing = [name for name, field in _dataclass_fields(cls).items()
               if name not in values and _default(field) is dataclasses.MISSING]
    if missing:
        raise RecordShapeError(f"{path} has no {', '.join(repr(m) for m in missing)}")
    return cls(**values)


def _load(hint: Any, value: Any, path: str) -> Any:
    part = _part_type(hint)
    if part is not None:
        if value is None and _allows_none(hint):
            return None
        return from_json(part, value, path)
    item = _list_item_part(hint)
    if item is not None:
        if not isinstance(value, list):
            raise RecordShapeError(f"{path} must be a list, found {type(value).__name__}")
        return [from_json(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


@functools.cache
def _dataclass_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


@functools.cache
def _fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {name: hints[name] for name in _dataclass_fields(cls)}


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
