"""One registry type for every kind of name the benchmark resolves: methods, tasks, named models, presets.

Each kind keeps its own data (the generated method catalog, the task suites' tables, named_models.toml, the
preset files) and hands it to a `LazyRegistry` as a function returning ``{name: entry}``, called on first use.
An entry is either the thing itself or a ``"module:attribute"`` string, imported only when that one name is
asked for (`get`), so that listing names and checking them (`names`, `in`) imports no implementation, and no
torch. Third parties add names through an entry-point group of their distribution's metadata, one group per
kind (``kvbench.methods``, ``kvbench.tasks``, ``kvbench.models``, ``kvbench.presets``: docs/plugins.md), read
on every lookup so a package installed into the running environment counts at once; code may also `register`
a name at run time (a conftest). An unknown name is refused in one shape for every kind, naming the closest
names (difflib) and every valid one: ``unknown method 'snapk' (did you mean 'snapkv'?); valid methods: ...``.

It sits in kvmethods' lowest layer so that kvmethods' registry and pytest_kvbench's (which may import kvmethods,
never the reverse) share it; it imports nothing but the standard library.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

T = TypeVar("T")

CLOSE_NAMES = 3  # how many close names a refusal suggests
_SHOWN = 40  # characters of an unknown name a refusal repeats


def shown_name(name: Any) -> str:
    """The name as a refusal repeats it: its repr, cut so that the line stays readable."""
    text = repr(name)
    return text if len(text) <= _SHOWN else f"{text[:_SHOWN]}... ({len(str(name)):,} characters)"


def close_names(name: Any, names: Iterable[str], n: int = CLOSE_NAMES) -> list[str]:
    """The valid names closest to a mistyped one, best first: those it begins (a name cut short), then difflib's
    closest (ratio at least 0.6)."""
    if not isinstance(name, str) or not name.strip():
        return []
    names = list(names)
    typed = name.strip().lower()
    begun = [valid for valid in names if valid.lower().startswith(typed)]
    similar = difflib.get_close_matches(typed, [valid.lower() for valid in names], n=n)
    by_lower = {valid.lower(): valid for valid in names}
    return list(dict.fromkeys(begun + [by_lower[low] for low in similar]))[:n]


def unknown_name_message(kind: str, name: Any, names: Iterable[str], plural: str = "", note: str = "") -> str:
    """The one refusal of an unknown name, for every kind: ``unknown KIND 'NAME' (did you mean 'A' or 'B'?);
    valid KINDs: ...`` and, when the kind has one, a note on what else the name could have been."""
    names = list(names)
    close = close_names(name, names)
    quoted = [repr(c) for c in close]
    said = f"{', '.join(quoted[:-1])} or {quoted[-1]}" if len(quoted) > 1 else "".join(quoted)
    hint = f" (did you mean {said}?)" if said else ""
    tail = f"; {note}" if note else ""
    return f"unknown {kind} {shown_name(name)}{hint}; valid {plural or kind + 's'}: {', '.join(names)}{tail}"


def import_target(target: str) -> Any:
    """The object a ``"module:attribute"`` (or ``"module:a.b"``) string names, its module imported now."""
    module, _, attribute = target.partition(":")
    obj = importlib.import_module(module)
    for part in attribute.split(".") if attribute else ():
        obj = getattr(obj, part)
    return obj


_read: dict[str, tuple[tuple, dict[str, EntryPoint]]] = {}  # group -> (sys.path's state, its entry points)


def _path_state() -> tuple:
    """sys.path and each folder's modification time: a distribution installed or removed changes one."""
    state = []
    for folder in sys.path:
        try:
            state.append((folder, os.stat(folder or ".").st_mtime_ns))
        except OSError:
            state.append((folder, None))
    return tuple(state)


def group_entry_points(group: str) -> dict[str, EntryPoint]:
    """An entry-point group's points by name, read again whenever sys.path or one of its folders changed (reading
    every distribution's metadata takes tens of milliseconds; a stat of each folder, microseconds)."""
    state = _path_state()
    known = _read.get(group)
    if known is None or known[0] != state:
        known = _read[group] = (state, {point.name: point for point in entry_points(group=group)})
    return dict(known[1])


@dataclass
class LazyRegistry(Generic[T]):
    """Names of one kind -> objects: the kind's own entries (lazy), the entry-point group's, registered ones.

    `check(obj, origin)` (optional) validates what an entry point or a registration gives and returns what the
    registry hands out (a kind-specific error naming `origin` when it is not one); `error` builds the kind's
    exception from a one-line message, so every refusal keeps its kind's type (MethodError, TaskError, ...).
    """

    kind: str  # "method": how a refusal names one
    group: str  # the entry-point group third parties add names through
    entries: Callable[[], Mapping[str, Any]]  # the kind's own data, {name: object or "module:attribute"}
    error: Callable[[str], Exception] = ValueError
    check: Callable[[Any, str], T] | None = None
    plural: str = ""  # "presets": defaults to kind + "s"
    note: str = ""  # what the refusal adds after the valid names ("see `kvbench models`")
    sort: bool = True  # names() in order (else: built-ins in their own order, then the others sorted)
    _registered: dict[str, T] = field(default_factory=dict, repr=False)

    def builtin_names(self) -> list[str]:
        return list(self.entries())

    def entry_points(self) -> dict[str, EntryPoint]:
        """The group's entry points now (a distribution installed or removed since is seen)."""
        return group_entry_points(self.group)

    def names(self) -> list[str]:
        """Every valid name, importing nothing (an entry point's name is its metadata)."""
        builtins = self.builtin_names()
        others = sorted((set(self._registered) | set(self.entry_points())) - set(builtins))
        return sorted(set(builtins) | set(others)) if self.sort else builtins + others

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self.entries() or name in self._registered
                                          or name in self.entry_points())

    def origin(self, name: str) -> str:
        """Where a name comes from, as a refusal about its object says it."""
        if name in self.entries():
            return f"built-in {self.kind} {name!r}"
        if name in self._registered:
            return f"registered {self.kind} {name!r}"
        point = self.entry_points().get(name)
        return f"entry point {name!r} ({self.group}: {point.value})" if point else f"{self.kind} {name!r}"

    def unknown(self, name: Any) -> Exception:
        """The kind's error for a name that is none of its names."""
        return self.error(unknown_name_message(self.kind, name, self.names(), self.plural, self.note))

    def get(self, name: Any) -> T:
        """The object of a name: a built-in entry (its module imported now when it is a string), a registered
        one, or an entry point's (loaded and checked); the kind's error in one line otherwise."""
        if not isinstance(name, str):
            raise self.unknown(name)
        builtins = self.entries()
        if name in builtins:
            entry = builtins[name]
            return import_target(entry) if isinstance(entry, str) else entry
        if name in self._registered:
            return self._registered[name]
        point = self.entry_points().get(name)
        if point is None:
            raise self.unknown(name)
        origin = self.origin(name)
        try:
            loaded = point.load()
        except Exception as error:  # a broken third-party package must not crash the run: one line
            raise self.error(f"{origin} failed to load: {type(error).__name__}: {error}") from error
        return self.check(loaded, origin) if self.check is not None else loaded

    def register(self, name: str, obj: Any) -> T:
        """Add a name at run time (a conftest, a test); the same object again is a no-op, another one under a
        name that exists is refused."""
        checked = self.check(obj, f"register {self.kind} {name!r}") if self.check is not None else obj
        existing = self._registered.get(name)
        if existing is None and (name in self.entries() or name in self.entry_points()):
            existing = self.get(name)
        if existing is not None and existing is not checked:
            raise self.error(f"a {self.kind} named {name!r} already exists ({self.origin(name)})")
        self._registered[name] = checked
        return checked

    def unregister(self, name: str) -> None:
        """Remove a run-time registration (tests, interactive sessions)."""
        self._registered.pop(name, None)
