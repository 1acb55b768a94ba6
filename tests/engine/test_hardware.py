"""Hardware figures: device description, per-item peak memory and energy, model size on disk.

GPU paths run on a CPU-only machine by faking ``torch.cuda`` and ``pynvml`` (see ``fake_gpu``):
the fakes keep just enough state (an allocator with a peak mark, an energy counter, a power
reading) for the tests to check that the meter resets, reads and subtracts the right things.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pynvml
import pytest
import torch

from pytest_kvbench.engine.hardware import cpu_peak_memory, device_description
from pytest_kvbench.engine.hardware.device_description import describe_device
from pytest_kvbench.engine.hardware.costs import kv_cache_figures, latency_figures, model_size_on_disk
from pytest_kvbench.engine.hardware.gpu_energy import integrate_energy_j
from pytest_kvbench.engine.hardware.item_meter import ItemMeter
from pytest_kvbench.engine.hardware.nvml import nvml_device_ref
from pytest_kvbench.engine.hardware.sampler import PeriodicSampler

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


# ---------------------------------------------------------------------------- describe_device


def test_describe_cuda_device(fake_gpu):
    fake_gpu.cuda.properties = SimpleNamespace(uuid="u", total_memory=80 * GiB)
    info = describe_device("cuda:0")
    assert info["type"] == "cuda"
    assert info["name"] == "NVIDIA H100 80GB HBM3"
    assert info["driver"] == "550.54.15"
    assert info["cuda_version"] == "12.4"
    assert info["count"] == 8
    assert info["memory_bytes"] == 80 * GiB
    assert info["torch"] == torch.__version__
    assert info["cpu_model"]
    assert fake_gpu.nvml.inits == fake_gpu.nvml.shutdowns == 1


def test_describe_cuda_device_without_nvml_has_no_driver(fake_gpu):
    fake_gpu.nvml.available = False
    info = describe_device("cuda:0")
    assert info["driver"] is None
    assert info["name"] == "NVIDIA H100 80GB HBM3"
    assert "memory_bytes" not in info


def test_describe_cpu_device():
    info = describe_device("cpu")
    assert info["type"] == "cpu"
    assert info["name"] == info["cpu_model"] == device_description.cpu_model()
    assert info["driver"] is None
    assert info["count"] >= 1
    assert info["threads"] == torch.get_num_threads()


def test_cpu_model_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7763 64-Core Processor\n")
    assert device_description.cpu_model(cpuinfo) == "AMD EPYC 7763 64-Core Processor"


def test_cpu_model_falls_back_to_platform(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")  # ARM: no model name
    assert device_description.cpu_model(cpuinfo)
    assert device_description.cpu_model(tmp_path / "missing")


# ---------------------------------------------------------------------------- CPU peak RSS

linux_only = pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs Linux /proc")


def _touch_big_tensor() -> torch.Tensor:
    return torch.ones(256 * MiB // 4, dtype=torch.float32)  # 256 MiB, every page written


@linux_only
def test_cpu_peak_rss_grows_with_a_large_tensor_inside_the_meter():
    with ItemMeter("cpu") as small:
        pass
    with ItemMeter("cpu") as big:
        tensor = _touch_big_tensor()
    del tensor
    assert big.result["memory_kind"] == "cpu_rss"
    assert big.result["peak_method"] in ("vmhwm", "rss_sampling")
    assert big.result["peak_bytes"] >= small.result["peak_bytes"] + 200 * MiB
    assert big.result["energy_j"] is None


@pytest.mark.skipif(not cpu_peak_memory.reset_peak_rss(), reason="this kernel/sandbox cannot reset VmHWM")
def test_cpu_peak_rss_is_reset_per_item():
    with ItemMeter("cpu") as big:
        tensor = _touch_big_tensor()
        del tensor  # freed before the item ends: only an exact peak mark still sees it
    with ItemMeter("cpu") as after:
        pass
    assert big.result["peak_method"] == "vmhwm"
    assert big.result["peak_bytes"] >= after.result["peak_bytes"] + 200 * MiB


@linux_only
def test_cpu_peak_falls_back_to_rss_sampling_when_vmhwm_cannot_be_reset(monkeypatch):
    monkeypatch.setattr(cpu_peak_memory, "reset_peak_rss", lambda *a, **k: False)
    baseline = cpu_peak_memory.current_rss_bytes()
    with ItemMeter("cpu", rss_interval_s=3600) as meter:
        tensor = _touch_big_tensor()
    del tensor
    assert meter.result["peak_method"] == "rss_sampling"
    assert meter.result["peak_bytes"] >= baseline + 200 * MiB


def test_cpu_peak_falls_back_to_lifetime_maxrss_without_proc(monkeypatch):
    def no_proc(*args, **kwargs):
        raise FileNotFoundError("/proc/self/statm")

    monkeypatch.setattr(cpu_peak_memory, "reset_peak_rss", lambda *a, **k: False)
    monkeypatch.setattr(cpu_peak_memory, "current_rss_bytes", no_proc)
    with ItemMeter("cpu") as meter:
        pass
    assert meter.result["peak_method"] == "ru_maxrss_lifetime"
    assert meter.result["peak_bytes"] >= 10 * MiB  # a Python process with torch is far bigger


def test_reset_peak_rss_reports_failure_without_proc(tmp_path):
    assert cpu_peak_memory.reset_peak_rss(tmp_path) is False
    assert cpu_peak_memory.peak_rss_bytes(tmp_path) is None


def test_reset_peak_rss_detects_a_write_the_kernel_ignored(tmp_path):
    (tmp_path / "clear_refs").write_text("")
    (tmp_path / "status").write_text("Name:\tpython\nVmHWM:\t  900000 kB\nVmRSS:\t  100000 kB\n")
    assert cpu_peak_memory.reset_peak_rss(tmp_path) is False
    (tmp_path / "status").write_text("Name:\tpython\nVmHWM:\t  100000 kB\nVmRSS:\t  100000 kB\n")
    assert cpu_peak_memory.reset_peak_rss(tmp_path) is True
    assert cpu_peak_memory.peak_rss_bytes(tmp_path) == 100000 * 1024


@linux_only
def test_lifetime_max_rss_is_in_bytes():
    # ru_maxrss is in kB on Linux; left unconverted it would be ~1000x below the current RSS.
    # (Half, not all, of it: clear_refs also lowers ru_maxrss, and RSS moves between the reads.)
    current = cpu_peak_memory.current_rss_bytes()
    assert cpu_peak_memory.lifetime_max_rss_bytes() >= current // 2


# ---------------------------------------------------------------------------- model size


def _write(path: Path, nbytes: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * nbytes)
    return path


def test_model_size_counts_safetensors_only_when_present(tmp_path):
    _write(tmp_path / "model-00001-of-00002.safetensors", 1000)
    _write(tmp_path / "model-00002-of-00002.safetensors", 500)
    _write(tmp_path / "pytorch_model.bin", 1500)        # same weights in the old format
    _write(tmp_path / "original" / "consolidated.pth", 1500)  # a copy transformers never reads
    _write(tmp_path / "config.json", 10)
    assert model_size_on_disk(tmp_path) == 1500


def test_model_size_counts_bin_weights_but_not_training_args(tmp_path):
    _write(tmp_path / "pytorch_model.bin", 700)
    _write(tmp_path / "training_args.bin", 50)
    assert model_size_on_disk(str(tmp_path)) == 700


def test_model_size_of_a_single_file(tmp_path):
    assert model_size_on_disk(_write(tmp_path / "model.safetensors", 321)) == 321


def test_model_size_of_a_cached_hub_repo_follows_snapshot_symlinks(tmp_path, monkeypatch):
    import huggingface_hub.constants

    repo = tmp_path / "models--org--tiny"
    _write(repo / "blobs" / "abc123", 4096)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("deadbeef")
    snapshot = repo / "snapshots" / "deadbeef"
    snapshot.mkdir(parents=True)
    os.symlink("../../blobs/abc123", snapshot / "model.safetensors")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert model_size_on_disk(snapshot) == 4096
    assert model_size_on_disk("org/tiny") == 4096
    assert model_size_on_disk("org/not-downloaded") is None


# ---------------------------------------------------------------------------- per-item figures


def test_kv_cache_figures_weight_the_ratio_by_prompt_length():
    figures = kv_cache_figures([4000, 1000], [1000, 1000])
    assert figures == {"kv_bytes_before": 2500, "kv_bytes_after": 1000, "compression_ratio": 2.5}


def test_kv_cache_figures_without_compression_and_without_samples():
    assert kv_cache_figures([800], [800])["compression_ratio"] == 1.0
    assert kv_cache_figures([], []) == {"kv_bytes_before": None, "kv_bytes_after": None, "compression_ratio": None}
    with pytest.raises(ValueError):
        kv_cache_figures([1, 2], [1])


def test_latency_figures_decode_rate_is_a_throughput_not_a_mean_of_rates():
    figures = latency_figures(prefill_s=[0.2, 0.4], decode_s=[1.0, 3.0], decode_tokens=[10, 90], total_s=5.0)
    # mean of per-sample rates would be (10 + 30) / 2 = 20; the throughput is 100 / 4 = 25.
    assert figures == {"prefill_ms": 300.0, "decode_tokens_per_s": 25.0, "total_s": 5.0}


def test_latency_figures_without_decode_time():
    figures = latency_figures(prefill_s=[0.1], decode_s=[0.0], decode_tokens=[0])
    assert figures["decode_tokens_per_s"] is None
    assert figures["total_s"] is None


def test_gpu_records_carry_the_gpu_name_and_driver_described_once_per_worker(fake_gpu):
    """The runner puts describe_device into every record; NVML is asked once, not once per item."""
    from pytest_kvbench.engine.runner import Runner
    from pytest_kvbench.cases import Grid

    runner = Runner(Grid(), "bench_run")
    first = runner.device_description("cuda:0")
    assert (first["type"], first["name"], first["driver"]) == ("cuda", "NVIDIA H100 80GB HBM3", "550.54.15")
    assert runner.device_description("cuda:0") is first
    assert fake_gpu.nvml.inits == 1
