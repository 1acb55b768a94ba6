"""Fakes of torch.cuda's memory statistics and pynvml for the hardware meter's tests on a CPU-only machine.

The fakes keep just enough state (an allocator with a peak mark, an energy counter, a power reading) for the
tests to check that the meter resets, reads and subtracts the right things. Tests take the ``fake_gpu`` fixture
by importing it (tests/engine/test_gpu_meter.py, test_device_description.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest
import torch

MiB = 2**20
GiB = 2**30


class FakeClock:
    """Time that only moves when a test moves it."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FakeNvml:
    """The pynvml calls the meter makes, with a counter (mJ) and a power reading (mW) to set."""

    def __init__(self) -> None:
        self.available = True
        self.counter_supported = True
        self.power_supported = True
        self.energy_mj = 5_000_000
        self.power_mw = 250_000
        self.driver = "550.54.15"
        self.inits = 0
        self.shutdowns = 0
        self.handle_requests: list[tuple[str, object]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(pynvml, "nvmlInit", self.nvmlInit)
        monkeypatch.setattr(pynvml, "nvmlShutdown", self.nvmlShutdown)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", self.by_index)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByUUID", self.by_uuid)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetTotalEnergyConsumption", self.energy)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetPowerUsage", self.power)
        monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: self.driver)

    def nvmlInit(self) -> None:
        if not self.available:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def by_index(self, index: int):
        self.handle_requests.append(("index", index))
        return ("handle", index)

    def by_uuid(self, uuid: str):
        self.handle_requests.append(("uuid", uuid))
        return ("handle", uuid)

    def energy(self, handle) -> int:
        if not self.counter_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.energy_mj

    def power(self, handle) -> int:
        if not self.power_supported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.power_mw


class FakeCuda:
    """torch.cuda's memory statistics: an allocator with a resettable peak mark."""

    def __init__(self) -> None:
        self.allocated = 0
        self.peak = 0
        self.resets: list[int] = []
        self.synchronized: list[int] = []
        self.properties = None  # like a CPU build: get_device_properties raises

    def allocate(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)

    def free(self, nbytes: int) -> None:
        self.allocated -= nbytes

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "NVIDIA H100 80GB HBM3")
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: self.synchronized.append(device))
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset_peak)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.peak)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: self.peak + 512 * MiB)
        monkeypatch.setattr(torch.cuda, "get_device_properties", self.get_properties)
        monkeypatch.setattr(torch.version, "cuda", "12.4")

    def reset_peak(self, device=None) -> None:
        self.resets.append(device)
        self.peak = self.allocated

    def get_properties(self, index):
        if self.properties is None:
            raise AssertionError("Torch not compiled with CUDA enabled")
        return self.properties


@pytest.fixture
def fake_gpu(monkeypatch):
    nvml, cuda = FakeNvml(), FakeCuda()
    nvml.install(monkeypatch)
    cuda.install(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return SimpleNamespace(nvml=nvml, cuda=cuda)

