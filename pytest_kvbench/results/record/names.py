"""Whether a record's names are names: what ``kvbench merge`` checks before it takes a record in.

A record read from another machine's run may have been edited or crafted. Its method, task, model and
budget become folder names and table rows of the merged run, so a name holding a path separator, ``..``
or a control character is refused (one line naming the record) rather than carried into the merged run.
The rules follow what the grid itself produces: method names are registry names (``snapkv``,
``snapkv+kivi``, ``kvpress:SnapKVPress``) with parameters in ``(...)``; task names are registry names
with optional ``:key=value`` parameters; models are hub ids, named models or paths; budgets parse.
"""

from __future__ import annotations

import re

from kvmethods import Budget, MethodError
from pytest_kvbench.results.record import Record

_METHOD = re.compile(r"(kvpress:)?[A-Za-z0-9_-]+(\+(kvpress:)?[A-Za-z0-9_-]+)*(\([^()/\\]*\))?", re.ASCII)
_TASK = re.compile(r"[A-Za-z0-9_]+(:[A-Za-z0-9_]+=[A-Za-z0-9_.-]+)*(@[0-9]+)?", re.ASCII)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class RecordNameError(ValueError):
    """A record whose names are not names; the message names the record and the field."""


def _model_ok(name: str) -> bool:
    """A hub id, a named model or a path: slashes allowed, no ``..`` or ``.`` part, no backslash or control."""
    parts = name.split("/")
    return bool(name.strip()) and "\\" not in name and not _CONTROL.search(name) and \
        not any(part in (".", "..") for part in parts[1:] + parts[:1])


def _budget_ok(spec: str) -> bool:
    if spec == "full":
        return True
    try:
        return Budget.parse(spec).spec == spec
    except MethodError:
        return False


def check_record_names(record: Record, where: str) -> None:
    """RecordNameError unless the record's key labels and name fields are valid method, task, model and
    budget names (``where``: the run it came from, for the message)."""
    label = record.labels
    fields = {
        "method": [label.method, str(record.method.name)],
        "task": [label.task, str(record.task.name)],
        "model": [label.model, str(record.model.name)],
        "budget": [label.budget, str(record.budget.spec)],
    }
    checks = {"method": lambda v: bool(_METHOD.fullmatch(v)) and ".." not in v,
              "task": lambda v: bool(_TASK.fullmatch(v)), "model": _model_ok, "budget": _budget_ok}
    for field, values in fields.items():
        for value in values:
            if not checks[field](value):
                raise RecordNameError(f"{where}: record {str(record.key)[:200]!r} has an invalid {field} "
                                      f"name {value[:100]!r}; refusing to merge it")
