"""A GGUF file's sha256 and header, remembered by (path, size, mtime, ctime, inode).

Hashing a 98 MB file and parsing its 49k-token vocabulary take seconds; configure runs in every
pytest process (each xdist worker too). The index keeps both per file identity, so they are paid
once per file version: a file that is replaced or rewritten changes its size, mtime, ctime or inode
and is read (and hashed) again. ctime is the one no user can set back: a file changed in place with
its size and mtime restored (``os.utime``, ``touch -r``, ``rsync -t``) kept its old entry, and so its
old float conversion, until ctime was part of the key. The index is a cache: a missing, unreadable or
stale entry is recomputed, never an error, and it is written atomically under a lock (several workers
configure at once).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from filelock import FileLock

from pytest_kvbench.atomic_files import atomic_write_json
from pytest_kvbench.model_sources import gguf_cache
from pytest_kvbench.model_sources.gguf_file import GgufInfo, check_architecture, read_info, sha256_of

INDEX_FILE = "index.json"


def _identity(path: Path) -> dict:
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns, "inode": stat.st_ino}


def _read_index(index: Path) -> dict:
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _remembered(entry: object, identity: dict) -> GgufInfo | None:
    if not isinstance(entry, dict) or entry.get("identity") != identity:
        return None
    try:
        return GgufInfo(**entry["info"])
    except (KeyError, TypeError):
        return None


def gguf_info(path: Path) -> GgufInfo:
    """The file's header and sha256, from the index when the file is unchanged; GgufError when it is
    unusable (unreadable, truncated, or of an architecture transformers does not map: never indexed)."""
    path = Path(os.path.realpath(path))
    identity = _identity(path)
    root = gguf_cache.cache_root()
    index = root / INDEX_FILE
    known = _remembered(_read_index(index).get(str(path)), identity)
    if known is not None:
        check_architecture(known, path)  # transformers may have changed since
        return known
    info = read_info(path, sha256_of(path))
    check_architecture(info, path)
    try:
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(index) + ".lock"):
            entries = _read_index(index)
            entries[str(path)] = {"identity": identity, "info": info.as_record()}
            atomic_write_json(index, entries)
    except OSError:
        pass  # a cache folder nobody may write: the file is read again next time, nothing is lost
    return info
