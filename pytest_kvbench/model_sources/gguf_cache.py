"""The float weights converted from a GGUF file, made once and kept, keyed by the file's sha256.

transformers dequantizes a GGUF file at every load (about 18 s for a 135M model on two cores);
the converted model saved with ``save_pretrained`` loads like any Hugging Face folder. An entry
``<root>/<sha256>/`` holds those files and a manifest with each file's size and XXH3-128 checksum (a
non-cryptographic hash made for corruption checks: ~0.05 s over the 517 MB of a converted 135M model where
sha256 takes ~0.4 CPU s, as long as loading the weights, which are memory-mapped); it is
built in a temporary folder and renamed into place under a file lock (two workers never convert
at once, a killed conversion leaves no entry), and it is used only when every file matches its
manifest: a corrupt or partial entry is rebuilt, never loaded.

The root is ``$KVBENCH_GGUF_CACHE``, else ``$XDG_CACHE_HOME/kvbench/gguf``, else ``~/.cache/kvbench/gguf``.
It is checked at startup (check_root, check_room): a file there, /proc, a read-only mount or a disk without
room for the float weights used to fail every item at its first model load.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import xxhash
from filelock import FileLock

from pytest_kvbench import user_paths
from pytest_kvbench.atomic_files import atomic_write_json
from pytest_kvbench.model_sources.gguf_file import GgufError, GgufInfo, file_digest, float_bytes

CACHE_ENV = "KVBENCH_GGUF_CACHE"
MANIFEST = "kvbench-gguf-manifest.json"
MANIFEST_FORMAT = "kvbench-gguf-conversion-2"  # -2: XXH3-128 file checksums (entries of -1 are rebuilt)


def cache_root() -> Path:
    given = os.environ.get(CACHE_ENV, "").strip()
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME", "").strip() or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvbench" / "gguf"


def _described(root: Path) -> str:
    if os.environ.get(CACHE_ENV, "").strip():
        return f"{CACHE_ENV} {user_paths.shown(root)}"
    return f"GGUF conversion cache {user_paths.shown(root)} (set {CACHE_ENV} to use another)"


def check_root() -> Path:
    """The cache root is a directory this process can write, or can be made: GgufError (one line) otherwise.
    ``access()`` says yes to root on /proc and on a read-only mount, so a folder made and removed is the test."""
    root = cache_root()
    try:
        user_paths.writable_dir(root, CACHE_ENV)
        if root.is_dir():
            os.rmdir(tempfile.mkdtemp(prefix=".kvbench-probe-", dir=root))
    except user_paths.PathError as exc:
        problem = str(exc).split(": ", 1)[1] if ": " in str(exc) else str(exc)
        raise GgufError(f"{_described(root)}: {problem}; a GGUF model is converted there once") from None
    except OSError as exc:
        raise GgufError(f"{_described(root)}: cannot write there ({(exc.strerror or str(exc)).lower()}); a GGUF "
                        f"model is converted there once") from None
    return root


def free_bytes(root: Path) -> int:
    """Free space on the file system that holds (or will hold) ``root``."""
    for place in (root, *root.absolute().parents):
        if place.is_dir():
            return shutil.disk_usage(place).free
    return shutil.disk_usage(Path.cwd()).free


def check_room(info: GgufInfo, planned: int = 0) -> int:
    """Room on the cache's disk for the file's float conversion (none needed when it is converted already), on
    top of ``planned`` bytes for other files of the same run; returns the bytes this one needs."""
    manifest = read_manifest(entry_dir(info.sha256))
    if manifest is not None and manifest.get("source_sha256") == info.sha256:
        return 0
    root, need = cache_root(), float_bytes(info)
    free = free_bytes(root)
    if free < planned + need:
        mib = 2**20
        raise GgufError(f"{_described(root)}: {free / mib:,.0f} MiB free, and the float conversion of {info.file} "
                        f"needs about {need / mib:,.0f} MiB{f' (after {planned / mib:,.0f} MiB for the others)' if planned else ''}; "
                        f"free some space or point {CACHE_ENV} at a larger disk")
    return need


def entry_dir(sha256: str) -> Path:
    return cache_root() / sha256


def read_manifest(entry: Path) -> dict | None:
    try:
        manifest = json.loads((entry / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(manifest, dict) and manifest.get("format") == MANIFEST_FORMAT and isinstance(manifest.get("files"), dict)
    return manifest if ok and manifest["files"] else None


def checksum_of(path: Path) -> str:
    """XXH3-128 of a converted file, checked at every load."""
    return file_digest(path, xxhash.xxh3_128())


def is_intact(entry: Path, sha256: str) -> bool:
    """The entry's manifest names this source, and every file it lists has its size and checksum."""
    manifest = read_manifest(entry)
    if manifest is None or manifest.get("source_sha256") != sha256:
        return False
    for name, expected in manifest["files"].items():
        file = entry / name
        if (not isinstance(expected, dict) or os.sep in name or not file.is_file()
                or file.stat().st_size != expected.get("size") or checksum_of(file) != expected.get("xxh3_128")):
            return False
    return True


def _write_manifest(folder: Path, sha256: str, details: dict) -> None:
    files = {p.name: {"size": p.stat().st_size, "xxh3_128": checksum_of(p)}
             for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    atomic_write_json(folder / MANIFEST, {"format": MANIFEST_FORMAT, "source_sha256": sha256, **details, "files": files})


def converted(sha256: str, convert: Callable[[Path], dict]) -> tuple[Path, bool]:
    """The intact entry for ``sha256`` and whether this call built it; ``convert(folder)`` saves the
    model into an empty folder and returns what the manifest should say of it."""
    entry = entry_dir(sha256)
    if is_intact(entry, sha256):
        return entry, False
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f"{sha256}.lock")):
        if is_intact(entry, sha256):  # another worker converted it while this one waited
            return entry, False
        building = Path(tempfile.mkdtemp(prefix=f".{sha256[:16]}.", dir=root))
        try:
            start = time.perf_counter()
            details = convert(building)
            _write_manifest(building, sha256, {**details, "conversion_s": round(time.perf_counter() - start, 2)})
            if entry.exists():  # corrupt or partial: moved aside first (a folder cannot be renamed over a full one)
                stale = Path(tempfile.mkdtemp(prefix=f".stale.{sha256[:16]}.", dir=root))
                os.replace(entry, stale / "entry")
                shutil.rmtree(stale, ignore_errors=True)
            os.replace(building, entry)
        finally:
            shutil.rmtree(building, ignore_errors=True)
    return entry, True
