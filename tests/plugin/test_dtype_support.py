"""--kvbench-dtype bfloat16 where the run computes on a CPU without bfloat16 instructions is one line at startup
(wiring/grid/dtype_support.py); with them, on a GPU, or where the CPU's flags cannot be read, it runs."""

from __future__ import annotations

import pytest

from test_bad_input import assert_one_line_usage_error
from pytest_kvbench.wiring.grid import dtype_support

X86_WITHOUT = "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n\nprocessor\t: 1\n"
X86_WITH = X86_WITHOUT.replace("avx512_vnni", "avx512_vnni avx512_bf16")
ARM_WITH = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


@pytest.mark.parametrize("text, flag, has", [(X86_WITHOUT, "avx512f", False), (X86_WITH, "avx512_bf16", True),
                                             (ARM_WITH, "bf16", True)])
def test_the_flags_are_read_from_cpuinfo(tmp_path, text, flag, has):
    (tmp_path / "cpuinfo").write_text(text)
    flags = dtype_support.cpu_flags(tmp_path / "cpuinfo")
    assert flag in flags
    assert (dtype_support.dtype_problem("bfloat16", False, flags) is None) == has


def test_only_bfloat16_on_a_cpu_without_it_is_a_problem(tmp_path):
    without = {"avx2", "avx512f"}
    assert "no bfloat16 instructions" in dtype_support.dtype_problem("bfloat16", False, without)
    assert dtype_support.dtype_problem("bfloat16", True, without) is None  # a GPU computes
    assert dtype_support.dtype_problem("float32", False, without) is None
    assert dtype_support.dtype_problem("auto", False, without) is None
    assert dtype_support.dtype_problem("bfloat16", False, None) is None  # no /proc/cpuinfo: not refused
    assert dtype_support.cpu_flags(tmp_path / "missing") is None


@pytest.fixture
def cpu_without_bf16(pytester, monkeypatch, tmp_path):
    (tmp_path / "cpuinfo").write_text(X86_WITHOUT)
    monkeypatch.setattr(dtype_support, "CPUINFO", str(tmp_path / "cpuinfo"))
    monkeypatch.setattr(dtype_support, "GPU_DRIVER_PATHS", ())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return pytester


def test_the_option_ini_key_and_grid_file_key_are_refused_in_one_line(cpu_without_bf16):
    line = assert_one_line_usage_error(cpu_without_bf16, "--kvbench-dtype=bfloat16")
    assert "dtype bfloat16 (--kvbench-dtype): this CPU has no bfloat16 instructions" in line and "use float32" in line
    cpu_without_bf16.makeini("[pytest]\nkvbench_dtype = bfloat16\n")
    assert "no bfloat16 instructions" in assert_one_line_usage_error(cpu_without_bf16)
    (cpu_without_bf16.path / "tox.ini").unlink()
    (cpu_without_bf16.path / "grid.toml").write_text('dtype = "bfloat16"\n')
    assert "no bfloat16 instructions" in assert_one_line_usage_error(cpu_without_bf16, "--kvbench-config", "grid.toml")
