"""NVML, the driver's view of the GPUs: which physical GPU torch's ``cuda:N`` is, and the driver version.

Every call is an attribute lookup on ``pynvml`` made at call time, so tests fake NVML with
``monkeypatch`` on a CPU-only machine.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import pynvml
import torch

NVML_ERRORS = (pynvml.NVMLError, OSError)


def nvml_device_ref(cuda_ordinal: int, environ: Mapping[str, str]) -> tuple[str, int | str]:
    """Which physical GPU NVML must read for torch's ``cuda:<cuda_ordinal>``.

    NVML ignores ``CUDA_VISIBLE_DEVICES``: in a worker that sees only GPU 5 as ``cuda:0``,
    NVML index 0 is someone else's GPU. Returns ``("index", n)`` or ``("uuid", "GPU-...")``
    following the visible-devices list; ``("index", cuda_ordinal)`` when the variable is unset.
    (Integer entries are assumed to follow NVML's PCI order; ``describe`` prefers the UUID that
    torch reports, which needs no such assumption.)
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return ("index", cuda_ordinal)
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if cuda_ordinal >= len(entries):
        raise ValueError(
            f"cuda:{cuda_ordinal} is not visible with CUDA_VISIBLE_DEVICES={visible!r}"
        )
    entry = entries[cuda_ordinal]
    if entry.isdigit():
        return ("index", int(entry))
    return ("uuid", entry)


def nvml_handle(cuda_ordinal: int, environ: Mapping[str, str] | None = None):
    """The NVML handle of the GPU torch calls ``cuda:<cuda_ordinal>`` (NVML must be initialised).

    Prefers the UUID torch reports for the device (exact even when CUDA and NVML order GPUs
    differently); falls back to mapping through ``CUDA_VISIBLE_DEVICES``.
    """
    try:
        uuid = str(torch.cuda.get_device_properties(cuda_ordinal).uuid)
    except (AssertionError, RuntimeError, AttributeError):
        uuid = None
    if uuid:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
        except NVML_ERRORS:
            pass
    kind, ref = nvml_device_ref(cuda_ordinal, os.environ if environ is None else environ)
    if kind == "uuid":
        return pynvml.nvmlDeviceGetHandleByUUID(ref)
    return pynvml.nvmlDeviceGetHandleByIndex(ref)


def nvidia_driver_version() -> str | None:
    """The NVIDIA driver version from NVML, or None where NVML is unavailable."""
    try:
        pynvml.nvmlInit()
    except NVML_ERRORS:
        return None
    try:
        return as_text(pynvml.nvmlSystemGetDriverVersion())
    except NVML_ERRORS:
        return None
    finally:
        nvml_shutdown()


def nvml_shutdown() -> None:
    try:
        pynvml.nvmlShutdown()
    except NVML_ERRORS:
        pass


def as_text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
