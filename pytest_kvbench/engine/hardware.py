"""Hardware figures a paper can print: what ran, how much memory and energy one item took.

Three jobs, each small:

* ``describe_device`` says what an item ran on (GPU name, driver, CUDA and torch versions, CPU).
* ``ItemMeter`` wraps one item's work and measures its *own* peak memory and energy: the peak is
  reset when the item starts (``torch.cuda.reset_peak_memory_stats`` on GPU; ``VmHWM`` reset via
  ``/proc/self/clear_refs`` on CPU), so a number never carries over from an earlier item.
* ``model_size_on_disk``, ``kv_cache_figures``, ``latency_figures`` turn raw counts into the
  per-model and per-item figures that go into records.

Every CUDA and NVML call is an attribute lookup on ``torch.cuda`` / ``pynvml`` made at call time,
so tests fake a GPU with ``monkeypatch`` on a CPU-only machine. Measuring never fails an item:
when a figure cannot be measured it is ``None`` and the method fields say why.
"""

from __future__ import annotations

import itertools
import os
import platform
import resource
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import pynvml
import torch

_NVML_ERRORS = (pynvml.NVMLError, OSError)
_PROC_SELF = Path("/proc/self")


# --------------------------------------------------------------------------------------------
# Device description


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


def usable_cpu_count() -> int:
    """CPUs this process may run on (container/cgroup affinity), which is what CPU timings use."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cuda_index(device: str) -> int:
    """The torch CUDA ordinal of ``"cuda"`` / ``"cuda:K"``; plain ``"cuda"`` means ordinal 0.

    Workers get one GPU each through ``CUDA_VISIBLE_DEVICES`` (see ``distributed.assign_device``),
    so inside a worker the device is always ordinal 0.
    """
    parsed = torch.device(device)
    if parsed.type != "cuda":
        raise ValueError(f"not a CUDA device: {device!r}")
    return parsed.index or 0


def nvidia_driver_version() -> str | None:
    """The NVIDIA driver version from NVML, or None where NVML is unavailable."""
    try:
        pynvml.nvmlInit()
    except _NVML_ERRORS:
        return None
    try:
        return _text(pynvml.nvmlSystemGetDriverVersion())
    except _NVML_ERRORS:
        return None
    finally:
        _nvml_shutdown()


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


# --------------------------------------------------------------------------------------------
# NVML: which physical GPU, and its energy


def nvml_device_ref(cuda_ordinal: int, environ: Mapping[str, str]) -> tuple[str, int | str]:
    """Which physical GPU NVML must read for torch's ``cuda:<cuda_ordinal>``.

    NVML ignores ``CUDA_VISIBLE_DEVICES``: in a worker that sees only GPU 5 as ``cuda:0``,
    NVML index 0 is someone else's GPU. Returns ``("index", n)`` or ``("uuid", "GPU-...")``
    following the visible-devices list; ``("index", cuda_ordinal)`` when the variable is unset.
    (Integer entries are assumed to follow NVML's PCI order; ``describe`` prefers the UUID that
    torch reports, which needs no such assumption.)
    """
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not visible.strip():
        return ("index", cuda_ordinal)
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if cuda_ordinal >= len(entries):
        raise ValueError(
            f"cuda:{cuda_ordinal} is not visible with CUDA_VISIBLE_DEVICES={visible!r}"
        )
    entry = entries[cuda_ordinal]
    if entry.isdigit():
        return ("index", int(entry))
    return ("uuid", entry)


def nvml_handle(cuda_ordinal: int, environ: Mapping[str, str] | None = None):
    """The NVML handle of the GPU torch calls ``cuda:<cuda_ordinal>`` (NVML must be initialised).

    Prefers the UUID torch reports for the device (exact even when CUDA and NVML order GPUs
    differently); falls back to mapping through ``CUDA_VISIBLE_DEVICES``.
    """
    try:
        uuid = str(torch.cuda.get_device_properties(cuda_ordinal).uuid)
    except (AssertionError, RuntimeError, AttributeError):
        uuid = None
    if uuid:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
        except _NVML_ERRORS:
            pass
    kind, ref = nvml_device_ref(cuda_ordinal, os.environ if environ is None else environ)
    if kind == "uuid":
        return pynvml.nvmlDeviceGetHandleByUUID(ref)
    return pynvml.nvmlDeviceGetHandleByIndex(ref)


class PeriodicSampler:
    """Reads a value at ``start()``, every ``interval_s`` in a daemon thread, and at ``stop()``.

    The first and last readings are taken synchronously, so even an item shorter than the
    interval gets two samples spanning its whole duration. ``clock`` is injectable so tests
    build samples from fake timestamps instead of sleeping. Readings that fail in the thread
    are skipped (NVML has transient errors); a failing first reading propagates from ``start``
    so callers can tell "this source does not work here". One sampler measures one interval.
    """

    def __init__(self, read: Callable[[], float], interval_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self._interval_s = interval_s
        self._clock = clock
        self._samples: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PeriodicSampler:
        self._samples = [(self._clock(), float(self._read()))]
        self._thread = threading.Thread(target=self._run, name="kvbench-sampler", daemon=True)
        self._thread.start()
        return self

    def sample(self) -> None:
        """Take one reading now (the thread calls this; tests may too)."""
        value = float(self._read())
        now = self._clock()
        with self._lock:
            self._samples.append((now, value))

    def stop(self) -> list[tuple[float, float]]:
        """Stop the thread, take the final reading, return all ``(time, value)`` samples."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            self.sample()
        except Exception:  # noqa: BLE001 - a failed last reading must not fail the item
            pass
        with self._lock:
            return list(self._samples)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - skip a transient failure, keep sampling
                continue


def integrate_energy_j(samples: Sequence[tuple[float, float]]) -> float | None:
    """Energy in joules from ``(seconds, watts)`` samples (trapezoid rule); None if < 2 samples."""
    if len(samples) < 2:
        return None
    ordered = sorted(samples)
    return sum((t1 - t0) * (p0 + p1) / 2.0 for (t0, p0), (t1, p1) in itertools.pairwise(ordered))


class _EnergyMeter:
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
        except _NVML_ERRORS:
            return
        self._nvml_open = True
        try:
            self._handle = nvml_handle(self._cuda_ordinal)
        except _NVML_ERRORS + (ValueError,):
            return
        try:
            self._start_mj = int(pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
            self.source = "nvml_counter"
            return
        except _NVML_ERRORS:
            pass
        handle = self._handle
        sampler = PeriodicSampler(lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                                  interval_s=self._interval_s, clock=self._clock)
        try:
            self._sampler = sampler.start()
            self.source = "power_sampling"
        except _NVML_ERRORS:
            pass

    def stop(self) -> float | None:
        """Joules used since ``start``; None (and ``source`` None) when nothing could measure it."""
        energy: float | None = None
        try:
            if self.source == "nvml_counter":
                try:
                    energy = (int(pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle)) - self._start_mj) / 1000.0
                except _NVML_ERRORS:
                    energy = None
            elif self.source == "power_sampling":
                energy = integrate_energy_j(self._sampler.stop())
        finally:
            if self._nvml_open:
                _nvml_shutdown()
                self._nvml_open = False
        if energy is None:
            self.source = None
        return energy


def _nvml_shutdown() -> None:
    try:
        pynvml.nvmlShutdown()
    except _NVML_ERRORS:
        pass


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --------------------------------------------------------------------------------------------
# CPU peak resident memory


def _status_kb(proc_self: Path) -> dict[str, int]:
    """``VmRSS`` / ``VmHWM`` (kB) from one read of ``/proc/self/status`` (a consistent pair)."""
    values: dict[str, int] = {}
    with open(proc_self / "status", encoding="ascii", errors="replace") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0])
    return values


def reset_peak_rss(proc_self: Path = _PROC_SELF) -> bool:
    """Reset the kernel's peak-RSS mark (``VmHWM``) by writing 5 to ``/proc/self/clear_refs``.

    ``ru_maxrss`` can never be reset, so this is the only exact per-item CPU peak. Returns True
    only if the reset is verified (``VmHWM`` dropped to the current RSS): some sandboxes accept
    the write and ignore it.
    """
    try:
        with open(proc_self / "clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        values = _status_kb(proc_self)
    except (OSError, ValueError, IndexError):
        return False
    if "VmHWM" not in values or "VmRSS" not in values:
        return False
    return values["VmHWM"] - values["VmRSS"] <= 1024  # one snapshot; allow 1 MiB of page churn


def peak_rss_bytes(proc_self: Path = _PROC_SELF) -> int | None:
    """``VmHWM`` in bytes: the peak resident memory since the last ``reset_peak_rss``."""
    try:
        return _status_kb(proc_self)["VmHWM"] * 1024
    except (OSError, KeyError, ValueError, IndexError):
        return None


def current_rss_bytes(proc_self: Path = _PROC_SELF) -> int:
    """Resident memory now, from ``/proc/self/statm`` (raises OSError where there is no /proc)."""
    with open(proc_self / "statm", encoding="ascii") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def lifetime_max_rss_bytes() -> int:
    """``ru_maxrss`` in bytes: the process's peak since it started (kB on Linux, bytes on macOS)."""
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024


class _CpuPeakMeter:
    """Per-item CPU peak RSS: exact ``VmHWM`` reset, else RSS sampling, else lifetime ``ru_maxrss``.

    ``method`` records which one was used, because they mean different things in a paper:
    "vmhwm" is exact, "rss_sampling" is a lower bound (a spike between samples is missed), and
    "ru_maxrss_lifetime" is the peak of the whole process, not of this item.
    """

    def __init__(self, clock: Callable[[], float], interval_s: float) -> None:
        self._clock = clock
        self._interval_s = interval_s
        self._sampler: PeriodicSampler | None = None
        self.method: str | None = None

    def start(self) -> None:
        if reset_peak_rss():
            self.method = "vmhwm"
            return
        sampler = PeriodicSampler(current_rss_bytes, interval_s=self._interval_s, clock=self._clock)
        try:
            self._sampler = sampler.start()
            self.method = "rss_sampling"
        except (OSError, ValueError, IndexError):
            self.method = "ru_maxrss_lifetime"

    def stop(self) -> int | None:
        if self.method == "vmhwm":
            peak = peak_rss_bytes()
            if peak is not None:
                return peak
            self.method = "ru_maxrss_lifetime"
        if self.method == "rss_sampling":
            return int(max(value for _, value in self._sampler.stop()))
        return lifetime_max_rss_bytes()


# --------------------------------------------------------------------------------------------
# One item's meter


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
        self._energy: _EnergyMeter | None = None
        self._cpu: _CpuPeakMeter | None = None
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
            self._energy = _EnergyMeter(self._ordinal, self._clock, self._power_interval_s)
            try:
                torch.cuda.synchronize(self._ordinal)  # earlier work must not count against this item
            except RuntimeError:
                pass  # a sticky CUDA error from an earlier item; this item will report it
            torch.cuda.reset_peak_memory_stats(self._ordinal)
            self._energy.start()
        else:
            self._cpu = _CpuPeakMeter(self._clock, self._rss_interval_s)
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


# --------------------------------------------------------------------------------------------
# Per-model and per-item figures


def _weight_files(directory: Path) -> list[Path]:
    """The files ``from_pretrained`` would load weights from: safetensors, else PyTorch ``.bin``.

    Only the top level: hub repos often ship a second copy (``original/consolidated.pth``) that
    transformers never reads, and counting it would double the size.
    """
    files = sorted(p for p in directory.iterdir() if p.is_file())
    safetensors = [p for p in files if p.name.endswith(".safetensors")]
    if safetensors:
        return safetensors
    return [p for p in files if p.name.endswith(".bin") and p.name != "training_args.bin"]


def _hub_snapshot(repo_id: str) -> Path | None:
    """The local HF cache snapshot of ``repo_id``, without touching the network."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached / not a repo id: size unknown, never an error
        return None


def model_size_on_disk(path_or_dir: str | os.PathLike) -> int | None:
    """Bytes of the model's weight files, for the per-model table (load time vs. size).

    Accepts a weight file, a local model directory, or a hub repo id already in the local HF
    cache (snapshot files are symlinks into ``blobs/``; their targets are measured). None when
    the model cannot be found locally: an unknown size is not zero.
    """
    path = Path(path_or_dir)
    if not path.exists():
        path = _hub_snapshot(str(path_or_dir))
        if path is None:
            return None
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in _weight_files(path))


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def kv_cache_figures(kv_bytes_before: Iterable[int], kv_bytes_after: Iterable[int]) -> dict:
    """Per-item KV-cache figures from per-sample cache sizes (``generate()``'s out.kv_bytes_*).

    ``kv_bytes_before`` / ``kv_bytes_after`` are per-sample means (prompts differ in length);
    ``compression_ratio`` is total-before / total-after, so it is weighted by prompt length and
    reads "the cache is N times smaller" (4.0 for a 4x smaller cache; 1.0 for full cache).
    """
    before = [int(b) for b in kv_bytes_before]
    after = [int(a) for a in kv_bytes_after]
    if len(before) != len(after):
        raise ValueError(f"{len(before)} kv_bytes_before values but {len(after)} kv_bytes_after values")
    mean_before, mean_after = _mean(before), _mean(after)
    ratio = round(sum(before) / sum(after), 4) if before and sum(after) > 0 else None
    return {
        "kv_bytes_before": round(mean_before) if mean_before is not None else None,
        "kv_bytes_after": round(mean_after) if mean_after is not None else None,
        "compression_ratio": ratio,
    }


def latency_figures(prefill_s: Iterable[float], decode_s: Iterable[float],
                    decode_tokens: Iterable[int], total_s: float | None = None) -> dict:
    """Per-item latency from per-sample timings (``generate()``'s out.prefill_s / out.decode_s).

    ``prefill_ms`` is the mean per sample. ``decode_tokens_per_s`` is total decode tokens over
    total decode time (a throughput, not a mean of per-sample rates, which short answers would
    dominate); pass the tokens produced *during* the decode phase, not the one prefill emitted.
    None when there was no decode time to divide by.
    """
    prefill = [float(s) for s in prefill_s]
    decode = [float(s) for s in decode_s]
    tokens = [int(t) for t in decode_tokens]
    if len(decode) != len(tokens):
        raise ValueError(f"{len(decode)} decode times but {len(tokens)} decode token counts")
    mean_prefill = _mean(prefill)
    decode_time = sum(decode)
    return {
        "prefill_ms": round(mean_prefill * 1000.0, 3) if mean_prefill is not None else None,
        "decode_tokens_per_s": round(sum(tokens) / decode_time, 3) if decode_time > 0 else None,
        "total_s": round(total_s, 4) if total_s is not None else None,
    }
