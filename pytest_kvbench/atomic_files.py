"""Whole files written atomically: readers see the old file or the new one, never a part.

Run directories (results/run/storage.py), baselines, reports and the GGUF conversion cache
(model_sources/) all write this way, so it lives below all of them: a temporary sibling, fsync, then a
rename into place.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

_UMASK = os.umask(0)
os.umask(_UMASK)


def json_text(obj: Any, indent: int | None = 2) -> str:
    """The project's JSON spelling: UTF-8 kept, anything else written as its str()."""
    return json.dumps(obj, indent=indent, ensure_ascii=False, default=str)


def atomic_write_text(path: str | os.PathLike, text: str, make_parents: bool = True) -> None:
    """Write ``text`` to ``path`` so that readers see the old file or the new one, never a part; its missing
    folders are made unless ``make_parents`` is False (a user's output path: FileNotFoundError instead)."""
    path = Path(path)
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; results are shared files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | os.PathLike, obj: Any, make_parents: bool = True) -> None:
    atomic_write_text(path, json_text(obj) + "\n", make_parents)
