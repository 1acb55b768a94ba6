"""What an item ran on, for its record: GPU name, driver and memory on CUDA; the CPU model on CPU."""

from __future__ import annotations

import os
import platform

import torch

from pytest_kvbench.engine.hardware.cpu_count import usable_cpu_count
from pytest_kvbench.engine.hardware.nvml import nvidia_driver_version


def cpu_model(cpuinfo: str | os.PathLike = "/proc/cpuinfo") -> str:
    """The CPU's marketing name: ``/proc/cpuinfo`` "model name" on Linux, else ``platform``."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("model name", "Model Name", "cpu model") and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cuda_index(device: str) -> int:
    """The torch CUDA ordinal of ``"cuda"`` / ``"cuda:K"``; plain ``"cuda"`` means ordinal 0.

    Workers get one GPU each through ``CUDA_VISIBLE_DEVICES`` (see ``wiring/gpu_slots.assign_device``),
    so inside a worker the device is always ordinal 0.
    """
    parsed = torch.device(device)
    if parsed.type != "cuda":
        raise ValueError(f"not a CUDA device: {device!r}")
    return parsed.index or 0


def describe_device(device: str) -> dict:
    """What an item ran on, for records and the results table.

    Keys: ``type`` ("cuda" | "cpu" | other torch device types), ``name`` (GPU name, or the CPU
    model off-GPU), ``driver`` (NVIDIA driver or None), ``cuda_version`` (torch's CUDA runtime),
    ``cpu_model``, ``torch``, ``count`` (visible GPUs, or usable CPUs); on CUDA also
    ``memory_bytes`` (total device memory) when torch can report it; off-GPU ``threads`` (torch
    intra-op threads, which CPU timings depend on).
    """
    kind = torch.device(device).type
    info: dict = {
        "type": kind,
        "name": None,
        "driver": None,
        "cuda_version": torch.version.cuda,
        "cpu_model": cpu_model(),
        "torch": torch.__version__,
        "count": None,
    }
    if kind == "cuda":
        index = cuda_index(device)
        info["name"] = torch.cuda.get_device_name(index)
        info["count"] = torch.cuda.device_count()
        info["driver"] = nvidia_driver_version()
        try:
            info["memory_bytes"] = int(torch.cuda.get_device_properties(index).total_memory)
        except (AssertionError, RuntimeError, AttributeError):
            pass
    else:
        info["name"] = info["cpu_model"]
        info["count"] = usable_cpu_count()
        info["threads"] = torch.get_num_threads()
    return info
