"""The meter around one item's work: its own peak memory (GPU or CPU), energy and wall time.

The peak is reset when the item starts (``torch.cuda.reset_peak_memory_stats`` on GPU; ``VmHWM``
reset via ``/proc/self/clear_refs`` on CPU), so a number never carries over from an earlier item.
Measuring never fails an item: a figure that cannot be measured is ``None`` and the method
fields say why. CUDA calls are attribute lookups made at call time, so tests fake a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from pytest_kvbench.engine.hardware.cpu_peak_memory import CpuPeakMeter
from pytest_kvbench.engine.hardware.device_description import cuda_index
from pytest_kvbench.engine.hardware.gpu_energy import EnergyMeter


class ItemMeter:
    """Context manager around one item's work: its peak memory, energy and wall time.

    On entry it resets the peak-memory mark (CUDA: ``reset_peak_memory_stats``; CPU: ``VmHWM``)
    and starts the energy reading; on exit (also when the item raised, so an out-of-memory item
    still reports how far it got) it synchronises the GPU and fills ``result``::

        {"peak_bytes", "memory_kind": "cuda_allocated" | "cpu_rss",
         "peak_method": "cuda_max_allocated" | "vmhwm" | "rss_sampling" | "ru_maxrss_lifetime",
         "peak_reserved_bytes" (CUDA only: what the caching allocator held, close to nvidia-smi),
         "energy_j" (None when unavailable), "energy_source": "nvml_counter" | "power_sampling" | None,
         "wall_s"}

    GPU peak memory includes the model weights; it is the number a reader needs to know whether
    a configuration fits on their card. ``clock`` and the sampling intervals are injectable so
    tests can drive the samplers with fake time.
    """

    def __init__(self, device: str, *, clock: Callable[[], float] = time.monotonic,
                 power_interval_s: float = 0.1, rss_interval_s: float = 0.05) -> None:
        self.device = device
        self._is_cuda = torch.device(device).type == "cuda"
        self._ordinal = cuda_index(device) if self._is_cuda else None
        self._clock = clock
        self._power_interval_s = power_interval_s
        self._rss_interval_s = rss_interval_s
        self._energy: EnergyMeter | None = None
        self._cpu: CpuPeakMeter | None = None
        self._started_at: float | None = None
        self._result: dict | None = None

    @property
    def result(self) -> dict:
        if self._result is None:
            raise RuntimeError("ItemMeter.result is available after the with-block ends")
        return self._result

    def __enter__(self) -> ItemMeter:
        self._result = None
        if self._is_cuda:
            self._energy = EnergyMeter(self._ordinal, self._clock, self._power_interval_s)
            try:
                torch.cuda.synchronize(self._ordinal)  # earlier work must not count against this item
            except RuntimeError:
                pass  # a sticky CUDA error from an earlier item; this item will report it
            torch.cuda.reset_peak_memory_stats(self._ordinal)
            self._energy.start()
        else:
            self._cpu = CpuPeakMeter(self._clock, self._rss_interval_s)
            self._cpu.start()
        self._started_at = self._clock()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._is_cuda:
            self._result = self._finish_cuda()
        else:
            peak = self._cpu.stop()
            self._result = {"peak_bytes": peak, "memory_kind": "cpu_rss", "peak_method": self._cpu.method,
                            "energy_j": None, "energy_source": None}
        self._result["wall_s"] = self._clock() - self._started_at
        return False

    def _finish_cuda(self) -> dict:
        try:
            torch.cuda.synchronize(self._ordinal)
        except RuntimeError:
            pass  # a sticky CUDA error from the item; the item already fails with it
        energy = self._energy.stop()
        try:
            peak = int(torch.cuda.max_memory_allocated(self._ordinal))
            reserved = int(torch.cuda.max_memory_reserved(self._ordinal))
        except RuntimeError:
            peak = reserved = None
        return {"peak_bytes": peak, "memory_kind": "cuda_allocated", "peak_method": "cuda_max_allocated",
                "peak_reserved_bytes": reserved, "energy_j": energy, "energy_source": self._energy.source}
