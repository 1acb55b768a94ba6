"""A safetensors file's header (JSON, read without torch), and whether the file holds every byte it declares.

A copy cut short (a download stopped, a disk that filled) still has its header; ``from_pretrained`` then fails
in every item ("incomplete metadata, file not fully covered"). The header names each tensor's byte range, so
the file's size says at startup whether they are all there. Reads go through ``user_paths.read_prefix`` (a
timeout), after the file was found to be a regular file.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from pytest_kvbench.user_paths import PathError, read_prefix

LENGTH_BYTES = 8  # the header's length, little-endian u64, before the JSON header
MAX_HEADER = 100 * 2**20  # a safetensors header longer than this is not one


class SafetensorsError(ValueError):
    """A safetensors file that cannot be loaded; one phrase naming what is wrong."""


def read_header(path: Path) -> tuple[int, dict]:
    """The header's length and JSON object; SafetensorsError when the file is too short, unreadable or not safetensors."""
    try:
        raw = read_prefix(path, LENGTH_BYTES, "weights file")
        if len(raw) < LENGTH_BYTES:
            raise SafetensorsError(f"{len(raw)} bytes, shorter than a safetensors header")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER:
            raise SafetensorsError(f"a header length of {length} bytes: not a safetensors file")
        data = read_prefix(path, LENGTH_BYTES + length, "weights file")[LENGTH_BYTES:]
    except PathError as exc:
        raise SafetensorsError(str(exc).split(": ", 1)[-1]) from None
    if len(data) < length:
        raise SafetensorsError(f"truncated inside its header ({os.path.getsize(path)} bytes)")
    try:
        header = json.loads(data)
    except ValueError:
        raise SafetensorsError("its header is not JSON: not a safetensors file") from None
    if not isinstance(header, dict):
        raise SafetensorsError("its header is not a JSON object: not a safetensors file")
    return length, header


def missing_bytes(path: Path) -> str | None:
    """Why the file is not whole (truncated, not safetensors), or None when every tensor's bytes are there."""
    try:
        length, header = read_header(path)
    except SafetensorsError as exc:
        return str(exc)
    ends = [entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"
            and isinstance(entry, dict) and isinstance(entry.get("data_offsets"), list)
            and len(entry["data_offsets"]) == 2 and isinstance(entry["data_offsets"][1], int)]
    needed = LENGTH_BYTES + length + max(ends, default=0)
    size = os.path.getsize(path)
    if size < needed:
        return f"truncated ({size} bytes, its tensors need {needed})"
    return None


def tensor_shapes(path: Path) -> dict[str, list[int]]:
    """Every tensor name and shape the file declares (empty when it is not readable safetensors)."""
    try:
        _, header = read_header(path)
    except SafetensorsError:
        return {}
    return {name: entry["shape"] for name, entry in header.items()
            if isinstance(entry, dict) and isinstance(entry.get("shape"), list)}
