"""The per-item GPU meter (engine/hardware/): this item's peak memory (not an earlier one's), energy from NVML's
counter or sampled power, and the physical GPU behind cuda:N.

GPU paths run on a CPU-only machine by faking ``torch.cuda`` and ``pynvml`` (tests/hardware_fakes.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import pynvml
import pytest
import torch
from hardware_fakes import GiB, MiB, FakeClock, fake_gpu  # noqa: F401 - fake_gpu: a fixture

from pytest_kvbench.engine.hardware.gpu_energy import integrate_energy_j
from pytest_kvbench.engine.hardware.item_meter import ItemMeter
from pytest_kvbench.engine.hardware.nvml import nvml_device_ref
from pytest_kvbench.engine.hardware.sampler import PeriodicSampler

# ---------------------------------------------------------------------------- GPU: memory


def test_gpu_peak_memory_is_this_items_peak_not_an_earlier_one(fake_gpu):
    cuda = fake_gpu.cuda
    cuda.allocate(2 * GiB)          # model weights, stay resident
    cuda.allocate(30 * GiB)         # an earlier, bigger item ...
    cuda.free(30 * GiB)             # ... that finished
    with ItemMeter("cuda:0") as meter:
        cuda.allocate(3 * GiB)
        cuda.free(3 * GiB)
    result = meter.result
    assert cuda.resets == [0]
    assert result["peak_bytes"] == 5 * GiB
    assert result["memory_kind"] == "cuda_allocated"
    assert result["peak_reserved_bytes"] == 5 * GiB + 512 * MiB


def test_gpu_meter_synchronises_before_reading(fake_gpu):
    with ItemMeter("cuda") as meter:
        fake_gpu.cuda.synchronized.clear()
    assert fake_gpu.cuda.synchronized == [0]  # once on exit, for device cuda:0
    assert meter.result["peak_method"] == "cuda_max_allocated"


def test_meter_still_reports_when_the_item_raises(fake_gpu):
    meter = ItemMeter("cuda:0")
    with pytest.raises(torch.OutOfMemoryError):
        with meter:
            fake_gpu.cuda.allocate(70 * GiB)
            raise torch.OutOfMemoryError("CUDA out of memory")
    assert meter.result["peak_bytes"] == 70 * GiB


def test_result_before_exit_is_an_error(fake_gpu):
    with ItemMeter("cuda:0") as meter:
        with pytest.raises(RuntimeError, match="after the with-block"):
            _ = meter.result


# ---------------------------------------------------------------------------- GPU: energy


def test_energy_from_the_nvml_counter_in_joules(fake_gpu):
    nvml = fake_gpu.nvml
    with ItemMeter("cuda:0") as meter:
        nvml.energy_mj += 450_500  # the counter is in millijoules
    assert meter.result["energy_j"] == pytest.approx(450.5)
    assert meter.result["energy_source"] == "nvml_counter"
    assert nvml.inits == nvml.shutdowns == 1


def test_energy_falls_back_to_power_sampling_when_the_counter_is_not_supported(fake_gpu):
    nvml, clock = fake_gpu.nvml, FakeClock(100.0)
    nvml.counter_supported = False
    nvml.power_mw = 250_000
    # An hour-long interval: the background thread never samples, the start and stop
    # readings (taken synchronously) span the item, so the result is exact.
    with ItemMeter("cuda:0", clock=clock, power_interval_s=3600) as meter:
        clock.now = 104.0
    assert meter.result["energy_source"] == "power_sampling"
    assert meter.result["energy_j"] == pytest.approx(250.0 * 4.0)
    assert meter.result["wall_s"] == pytest.approx(4.0)
    assert nvml.inits == nvml.shutdowns == 1


def test_a_reused_meter_does_not_carry_the_previous_items_energy_source(fake_gpu):
    meter = ItemMeter("cuda:0")
    with meter:
        fake_gpu.nvml.energy_mj += 1000
    assert meter.result["energy_source"] == "nvml_counter"
    fake_gpu.nvml.available = False
    with meter:
        pass
    assert meter.result["energy_j"] is None
    assert meter.result["energy_source"] is None


def test_energy_is_none_when_neither_counter_nor_power_is_supported(fake_gpu):
    fake_gpu.nvml.counter_supported = False
    fake_gpu.nvml.power_supported = False
    with ItemMeter("cuda:0", power_interval_s=3600) as meter:
        pass
    assert meter.result["energy_j"] is None
    assert meter.result["energy_source"] is None


def test_energy_is_none_without_nvml_and_memory_is_still_measured(fake_gpu):
    fake_gpu.nvml.available = False
    with ItemMeter("cuda:0") as meter:
        fake_gpu.cuda.allocate(GiB)
    assert meter.result["energy_j"] is None
    assert meter.result["energy_source"] is None
    assert meter.result["peak_bytes"] == GiB
    assert fake_gpu.nvml.shutdowns == 0


def test_power_sampler_integrates_changing_power_with_fake_time():
    clock, watts = FakeClock(0.0), [100.0]
    sampler = PeriodicSampler(lambda: watts[0], interval_s=3600, clock=clock).start()
    clock.now, watts[0] = 2.0, 300.0
    sampler.sample()
    clock.now = 3.0
    samples = sampler.stop()
    assert samples == [(0.0, 100.0), (2.0, 300.0), (3.0, 300.0)]
    # 2 s ramping 100 -> 300 W (400 J), then 1 s at 300 W (300 J).
    assert integrate_energy_j(samples) == pytest.approx(700.0)


def test_power_sampler_skips_failed_readings_in_the_thread_but_not_at_start():
    def broken():
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    with pytest.raises(pynvml.NVMLError):
        PeriodicSampler(broken).start()
    assert integrate_energy_j([(0.0, 50.0)]) is None


# ---------------------------------------------------------------------------- GPU: which device


@pytest.mark.parametrize(
    ("visible", "ordinal", "expected"),
    [
        (None, 0, ("index", 0)),
        (None, 3, ("index", 3)),
        ("5", 0, ("index", 5)),
        ("4,5,6", 1, ("index", 5)),
        ("GPU-8f1c2d3e-aaaa-bbbb-cccc-0123456789ab", 0, ("uuid", "GPU-8f1c2d3e-aaaa-bbbb-cccc-0123456789ab")),
    ],
)
def test_nvml_reads_the_physical_gpu_behind_cuda_visible_devices(visible, ordinal, expected):
    environ = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert nvml_device_ref(ordinal, environ) == expected


def test_nvml_device_ref_rejects_an_invisible_ordinal():
    with pytest.raises(ValueError, match="not visible"):
        nvml_device_ref(2, {"CUDA_VISIBLE_DEVICES": "4,5"})


def test_worker_meter_reads_energy_of_its_own_gpu(fake_gpu, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")  # what assign_device gives gw1 under "4,5,6"
    with ItemMeter("cuda"):
        pass
    assert fake_gpu.nvml.handle_requests == [("index", 5)]


def test_meter_prefers_the_uuid_torch_reports(fake_gpu, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    fake_gpu.cuda.properties = SimpleNamespace(uuid="8f1c2d3e-aaaa", total_memory=80 * GiB)
    with ItemMeter("cuda:0"):
        pass
    assert fake_gpu.nvml.handle_requests == [("uuid", "GPU-8f1c2d3e-aaaa")]
