"""The grid's dtype against the machine: bfloat16 where the run computes on a CPU without bfloat16 instructions is
refused at configure, in one line (exit 4).

`--kvbench-dtype bfloat16` (ini key `kvbench_dtype`, grid-file key `dtype`) loads the whole model in bfloat16; the
records' `model.dtype` says which dtype ran. On a CPU torch runs bfloat16 matrix products fast only with the
instructions for it (x86: AVX512_BF16 or AMX_BF16; Arm: BF16): without them it converts each operand and a
bfloat16 run is slower than float32, its figures a different model's for nothing. A run computes on the CPU when
the machine shows no GPU driver (GPU_DRIVER_PATHS, read without torch, as the xdist GPU count reads them); the CPU's
flags come from /proc/cpuinfo. Where that file is missing (macOS, Windows) nothing is refused. A GPU without
bfloat16 is refused when the model loads (engine/models.py), where torch is there to ask. Nothing here imports
the benchmark (gpu_slots reads GPU_DRIVER_PATHS from here in any xdist run); grid_checks raises the line.
"""

from __future__ import annotations

import os

# Where a GPU driver shows itself (NVIDIA, AMD ROCm, WSL): without any of them torch would count no GPU.
GPU_DRIVER_PATHS = ("/proc/driver/nvidia/gpus", "/dev/nvidiactl", "/dev/kfd", "/dev/dxg")
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86 flags, then Arm's "Features" entry
CPUINFO = "/proc/cpuinfo"


def gpu_driver_present() -> bool:
    return any(os.path.exists(path) for path in GPU_DRIVER_PATHS)


def cpu_flags(cpuinfo: str | os.PathLike | None = None) -> set[str] | None:
    """The first CPU's flags ("flags" on x86, "Features" on Arm), None where the file cannot be read."""
    try:
        with open(cpuinfo or CPUINFO, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, sep, value = line.partition(":")
                if sep and key.strip() in ("flags", "Features"):
                    return set(value.split())
    except OSError:
        return None
    return set()


def dtype_problem(dtype: str, on_gpu: bool, flags: set[str] | None) -> str | None:
    """Why `dtype` cannot run here (one line), or None."""
    if dtype != "bfloat16" or on_gpu or flags is None or flags & set(BF16_CPU_FLAGS):
        return None
    return (f"dtype bfloat16 (--kvbench-dtype): this CPU has no bfloat16 instructions (avx512_bf16, amx_bf16 on x86, "
            f"bf16 on Arm, per {CPUINFO}), so bfloat16 would run slower than float32; use float32 (or auto)")
