"""The CPU's per-item peak memory: VmHWM reset per item, else RSS sampling, else the lifetime ru_maxrss."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hardware_fakes import MiB

from pytest_kvbench.engine.hardware import cpu_peak_memory
from pytest_kvbench.engine.hardware.item_meter import ItemMeter

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
