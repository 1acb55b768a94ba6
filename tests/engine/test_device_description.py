"""What an item ran on: the GPU's name, driver and memory (NVML asked once per worker), or the CPU's model.

GPU paths run on a CPU-only machine by faking ``torch.cuda`` and ``pynvml`` (tests/hardware_fakes.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from hardware_fakes import GiB, fake_gpu  # noqa: F401 - fake_gpu: a fixture

from pytest_kvbench.cases import Grid
from pytest_kvbench.engine.hardware import device_description
from pytest_kvbench.engine.hardware.device_description import describe_device
from pytest_kvbench.engine.runner import Runner

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


def test_gpu_records_carry_the_gpu_name_and_driver_described_once_per_worker(fake_gpu):
    """The runner puts describe_device into every record; NVML is asked once, not once per item."""
    runner = Runner(Grid(), "bench_run")
    first = runner.device_description("cuda:0")
    assert (first["type"], first["name"], first["driver"]) == ("cuda", "NVIDIA H100 80GB HBM3", "550.54.15")
    assert runner.device_description("cuda:0") is first
    assert fake_gpu.nvml.inits == 1
