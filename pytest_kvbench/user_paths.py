"""Checks of the paths a user gives (options, ini keys, TOML keys, ``kvbench`` arguments).

A path the operating system refuses (a 300-character file name, a NUL byte, a file where a
directory is expected, a directory nobody may write) must be a one-line error when the command
starts, not an ``OSError`` traceback after an hour of benchmarking, and never the reason a
finished item's record is lost. So every path a user gives goes through one of the checks here
before anything is loaded or written; each raises ``PathError`` with one line that names the
option, the (shortened) path and what is wrong.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
import threading
from pathlib import Path

SHOWN_CHARS = 120  # a 300-character name is shortened in messages so that they stay one line
READ_TIMEOUT_S = 30.0  # a header read that has not answered by then is a stalled mount, not a slow disk


class PathError(ValueError):
    """A user-given path that cannot be used; the message is one line."""


def shown(path: str | os.PathLike) -> str:
    text = os.fspath(path)
    return text if len(text) <= SHOWN_CHARS else f"{text[:SHOWN_CHARS - 3]}... ({len(text)} characters)"


def _fail(what: str, path: str | os.PathLike, problem: str) -> PathError:
    return PathError(f"{what} {shown(path)}: {problem}")


def _limits(existing: Path) -> tuple[int, int]:
    """(longest file name, longest path) in bytes on the file system holding ``existing``."""
    try:
        return os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        return 255, 4096


def _check_spelling(what: str, path: str | os.PathLike) -> Path:
    text = os.fspath(path)
    if not text.strip():
        raise _fail(what, text, "empty path")
    if "\x00" in text:
        raise _fail(what, text.replace("\x00", "\\0"), "contains a NUL character")
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        raise _fail(what, text, "not representable in the file system's encoding") from None
    return Path(text).expanduser()


def _check_lengths(what: str, path: Path) -> None:
    """File names and the whole path within the file system's limits (ENAMETOOLONG otherwise)."""
    name_max, path_max = _limits(_nearest_existing(path))
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            raise _fail(what, path, f"file name too long ({len(os.fsencode(part))} bytes; the limit is {name_max})")
    if len(os.fsencode(str(path.absolute()))) >= path_max:
        raise _fail(what, path, f"path too long (the limit is {path_max} bytes)")


def _nearest_existing(path: Path) -> Path:
    """``path`` itself or its closest ancestor that exists (the current directory at worst)."""
    candidate = path.absolute()
    for parent in (candidate, *candidate.parents):
        try:
            if os.path.lexists(parent):
                return parent
        except (OSError, ValueError):
            continue
    return Path.cwd()


def _stat(what: str, path: Path) -> os.stat_result | None:
    """``os.stat`` of the path, None when it does not exist; any other refusal is a PathError."""
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENOTDIR:
            raise _fail(what, path, "a parent of it is a file, not a directory") from None
        raise _fail(what, path, (exc.strerror or str(exc)).lower()) from None


def checked(path: str | os.PathLike, what: str) -> tuple[Path, os.stat_result | None]:
    """The path, spelled and sized sanely, with its stat (None: does not exist)."""
    resolved = _check_spelling(what, path)
    _check_lengths(what, resolved)
    return resolved, _stat(what, resolved)


def existing_file(path: str | os.PathLike, what: str) -> Path:
    """A file that exists and can be read."""
    resolved, info = checked(path, what)
    if info is None:
        raise _fail(what, path, "not found")
    if stat.S_ISDIR(info.st_mode):
        raise _fail(what, path, "is a directory, not a file")
    if not os.access(resolved, os.R_OK):
        raise _fail(what, path, "not readable")
    return resolved


def regular_file(path: str | os.PathLike, what: str, min_bytes: int = 1, max_bytes: int | None = None) -> Path:
    """An existing, readable regular file (links followed) of a plausible size. A FIFO or a device (a link to
    /dev/zero) passes ``existing_file`` and then blocks or never ends the first read: a model or data file is
    asked this instead."""
    resolved = existing_file(path, what)
    info = os.stat(resolved)
    if not stat.S_ISREG(info.st_mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(info.st_mode) else "a device" if
                stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "a socket" if
                stat.S_ISSOCK(info.st_mode) else "not a regular file")
        raise _fail(what, path, f"is {kind}, not a regular file")
    if info.st_size < min_bytes:
        raise _fail(what, path, f"only {info.st_size} bytes, too short for a {what} (at least {min_bytes})")
    if max_bytes is not None and info.st_size > max_bytes:
        raise _fail(what, path, f"{info.st_size} bytes, too large for a {what} (at most {max_bytes})")
    return resolved


def read_prefix(path: str | os.PathLike, size: int, what: str, timeout_s: float = READ_TIMEOUT_S) -> bytes:
    """Up to ``size`` bytes from the start of a file, or PathError when the read has not returned within
    ``timeout_s`` (a stalled network mount: the reading thread is left behind, a daemon)."""
    outcome: dict = {}

    def read() -> None:
        try:
            with open(path, "rb") as handle:
                outcome["data"] = handle.read(size)
        except OSError as exc:
            outcome["error"] = exc

    reader = threading.Thread(target=read, name="kvbench-read-prefix", daemon=True)
    reader.start()
    reader.join(timeout_s)
    if reader.is_alive():
        raise _fail(what, path, f"no data within {timeout_s:g} s of reading it (a stalled mount?)")
    if "error" in outcome:
        raise _fail(what, path, (outcome["error"].strerror or str(outcome["error"])).lower())
    return outcome["data"]


def existing_dir(path: str | os.PathLike, what: str) -> Path:
    """A directory that exists and can be listed."""
    resolved, info = checked(path, what)
    if info is None:
        raise _fail(what, path, "not found")
    if not stat.S_ISDIR(info.st_mode):
        raise _fail(what, path, "is a file, not a directory")
    if not os.access(resolved, os.R_OK | os.X_OK):
        raise _fail(what, path, "not readable")
    return resolved


def _check_creatable(what: str, path: Path) -> None:
    """Whatever of ``path`` is missing can be created: its nearest existing ancestor is a writable dir."""
    ancestor = _nearest_existing(path.parent if path.parent != path else path)
    if not ancestor.is_dir():
        raise _fail(what, path, f"{shown(ancestor)} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise _fail(what, path, f"cannot create it: {shown(ancestor)} is not writable")
    # access() answers for permissions only: root passes it everywhere, and /proc, /sys or a read-only mount
    # still refuse. A folder made and removed at once is the real answer.
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".kvbench-probe-", dir=ancestor))
    except OSError as exc:
        raise _fail(what, path, f"cannot create it in {shown(ancestor)}: {(exc.strerror or str(exc)).lower()}") from None


def _check_parent_exists(what: str, path: Path) -> None:
    """The folder a user's output goes into exists: kvbench makes none of its parents (``/nonexistent/dir/x.md``
    made ``/nonexistent`` at the root)."""
    parent = path.absolute().parent
    if not os.path.isdir(parent):
        problem = "is a file, not a directory" if os.path.lexists(parent) else "does not exist"
        raise _fail(what, path, f"its folder {shown(parent)} {problem}; create it first (kvbench makes no folders "
                                f"outside the results directory)")


def writable_dir(path: str | os.PathLike, what: str, make_parents: bool = True) -> Path:
    """A directory that exists and is writable, or that can be created (with its missing parents, unless
    ``make_parents`` is False: a user's output folder goes into an existing one)."""
    resolved, info = checked(path, what)
    if info is None and os.path.islink(resolved):  # mkdir cannot make it ("File exists"), nor should it guess
        raise _fail(what, path, f"is a link to {shown(os.readlink(resolved))}, which does not exist; create that "
                                f"folder or give another path")
    if info is None:
        if not make_parents:
            _check_parent_exists(what, resolved)
        _check_creatable(what, resolved)
        return resolved
    if not stat.S_ISDIR(info.st_mode):
        raise _fail(what, path, "is a file, not a directory")
    if not os.access(resolved, os.W_OK | os.X_OK):
        raise _fail(what, path, "directory is not writable")
    return resolved


def writable_file(path: str | os.PathLike, what: str, make_parents: bool = True) -> tuple[Path, bool]:
    """A file that can be written (created, or replaced); returns (path, whether it exists). ``make_parents``
    False: a user's output file, whose folder must exist (nothing is made outside the results directory)."""
    resolved, info = checked(path, what)
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise _fail(what, path, "is a directory, not a file")
    if info is None:
        if not make_parents:
            _check_parent_exists(what, resolved)
        _check_creatable(what, resolved)
    elif not os.access(resolved.parent, os.W_OK | os.X_OK):
        raise _fail(what, path, f"cannot replace it: {shown(resolved.parent)} is not writable")
    return resolved, info is not None


def appendable_file(path: str | os.PathLike, what: str) -> Path:
    """A file that can be made, or that exists and can be appended to (a records log)."""
    resolved, exists = writable_file(path, what)
    if exists and not os.access(resolved, os.W_OK):
        raise _fail(what, path, "not writable")
    return resolved


def inside(child: str | os.PathLike, parent: str | os.PathLike) -> bool:
    """Whether ``child`` lies inside ``parent`` once ``..`` and links are resolved."""
    try:
        Path(child).resolve().relative_to(Path(parent).resolve())
    except ValueError:
        return False
    return True
