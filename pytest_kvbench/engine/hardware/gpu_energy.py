"""One item's GPU energy: NVML's energy counter, else sampled power, else nothing."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import pynvml

from pytest_kvbench.engine.hardware.nvml import NVML_ERRORS, nvml_handle, nvml_shutdown
from pytest_kvbench.engine.hardware.sampler import PeriodicSampler


def integrate_energy_j(samples: Sequence[tuple[float, float]]) -> float | None:
    """Energy in joules from ``(seconds, watts)`` samples (trapezoid rule); None if < 2 samples."""
    if len(samples) < 2:
        return None
    ordered = sorted(samples)
    return sum((t1 - t0) * (p0 + p1) / 2.0 for (t0, p0), (t1, p1) in itertools.pairwise(ordered))


class EnergyMeter:
    """GPU energy over one item: NVML's energy counter, else sampled power, else nothing.

    The counter (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since driver load, Volta
    and newer) is exact and free; older or virtualised GPUs raise ``NVMLError_NotSupported`` and
    get ``nvmlDeviceGetPowerUsage`` (milliwatts) sampled in a background thread instead. The
    figure is device-wide: another process on the same GPU adds to it.
    """

    def __init__(self, cuda_ordinal: int, clock: Callable[[], float], interval_s: float) -> None:
        self._cuda_ordinal = cuda_ordinal
        self._clock = clock
        self._interval_s = interval_s
        self._nvml_open = False
        self._handle = None
        self._start_mj: int | None = None
        self._sampler: PeriodicSampler | None = None
        self.source: str | None = None

    def start(self) -> None:
        try:
            pynvml.nvmlInit()
        except NVML_ERRORS:
            return
        self._nvml_open = True
        try:
            self._handle = nvml_handle(self._cuda_ordinal)
        except NVML_ERRORS + (ValueError,):
            return
        try:
            self._start_mj = int(pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
            self.source = "nvml_counter"
            return
        except NVML_ERRORS:
            pass
        handle = self._handle
        sampler = PeriodicSampler(lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                                  interval_s=self._interval_s, clock=self._clock)
        try:
            self._sampler = sampler.start()
            self.source = "power_sampling"
        except NVML_ERRORS:
            pass

    def stop(self) -> float | None:
        """Joules used since ``start``; None (and ``source`` None) when nothing could measure it."""
        energy: float | None = None
        try:
            if self.source == "nvml_counter":
                try:
                    energy = (int(pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)) - self._start_mj) / 1000.0
                except NVML_ERRORS:
                    energy = None
            elif self.source == "power_sampling":
                energy = integrate_energy_j(self._sampler.stop())
        finally:
            if self._nvml_open:
                nvml_shutdown()
                self._nvml_open = False
        if energy is None:
            self.source = None
        return energy
