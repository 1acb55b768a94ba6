"""One worker per GPU: which GPU an xdist worker takes, and who holds which GPU slot.

``assign_device`` tells an xdist worker which GPU to take (by narrowing ``CUDA_VISIBLE_DEVICES``
before CUDA initialises); ``DeviceSlots`` lets the controller give a replacement for a crashed
worker the crashed worker's GPU. Nothing here reads global state: callers pass the environment,
device count and worker id, so every function is tested without a GPU or xdist.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, MutableMapping

import pytest

from pytest_kvbench.wiring.grid.dtype_support import GPU_DRIVER_PATHS, gpu_driver_present  # noqa: F401 - one list

OVERSUBSCRIBE_OPTION = "--kvbench-allow-oversubscribe"


def cuda_device_count() -> int:
    """torch.cuda.device_count() (NVML: CUDA is not started), or 0 without importing torch on a machine with
    no GPU driver: every `pytest -n N` of a user's project with the plugin installed goes through here."""
    if not gpu_driver_present():
        return 0
    import torch  # lazy for startup time: only where a GPU driver is present

    return torch.cuda.device_count()


class UsageLikeError(ValueError):
    """A usage mistake with a one-line message; the plugin turns it into ``pytest.UsageError``."""


_WORKER_ID = re.compile(r"gw(\d+)")


def worker_index(worker_id: str | None) -> int | None:
    """``"gw3"`` -> 3; ``None`` / ``"master"`` (no xdist, or the controller) -> None."""
    if worker_id is None or worker_id == "master":
        return None
    match = _WORKER_ID.fullmatch(worker_id)
    if match is None:
        raise ValueError(f"not an xdist worker id: {worker_id!r} (expected 'gw<N>' or 'master')")
    return int(match.group(1))


def visible_devices(environ: Mapping[str, str], cuda_device_count: int) -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries (indices or UUIDs).

    Unset means all ``cuda_device_count`` devices. A set value is cut to ``cuda_device_count``
    entries: CUDA ignores entries past the first invalid one, and torch's count reflects that.
    """
    if cuda_device_count <= 0:
        return []
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return [str(i) for i in range(cuda_device_count)]
    entries = [entry.strip() for entry in value.split(",") if entry.strip()]
    return entries[:cuda_device_count]


def assign_device(worker_id: str | None, environ: Mapping[str, str], cuda_device_count: int,
                  allow_oversubscribe: bool = False, slot: int | None = None) -> dict[str, str]:
    """The environment changes that give xdist worker ``worker_id`` its own GPU.

    Worker gwK gets the K-th entry of the parent's ``CUDA_VISIBLE_DEVICES`` (device K when
    unset): ``{"CUDA_VISIBLE_DEVICES": "5"}`` for gw1 under ``"4,5,6"``. Apply it before CUDA
    initialises (``apply_environment``), after which the worker's GPU is ``cuda:0``.

    ``slot`` overrides K: xdist gives a replacement for a crashed worker a *new* id (gw8 under
    ``-n 8``), so the controller tracks which GPU the dead worker held (``DeviceSlots``) and
    passes it on. Without a slot, ids past the last GPU wrap around.

    Returns ``{}`` for the controller / a run without xdist, and on CPU-only machines.
    Raises ``UsageLikeError`` when ``PYTEST_XDIST_WORKER_COUNT`` exceeds the visible GPUs and
    ``allow_oversubscribe`` is false (workers would share GPUs and run out of memory).
    """
    index = worker_index(worker_id)
    if index is None:
        return {}
    devices = visible_devices(environ, cuda_device_count)
    if not devices:
        return {}
    workers = int(environ.get("PYTEST_XDIST_WORKER_COUNT") or index + 1)
    if workers > len(devices) and not allow_oversubscribe:
        shown = environ.get("CUDA_VISIBLE_DEVICES")
        where = f"CUDA_VISIBLE_DEVICES={shown}" if shown is not None else f"{len(devices)} on this machine"
        raise UsageLikeError(
            f"{workers} xdist workers but only {len(devices)} GPU(s) visible ({where}); "
            f"use -n {len(devices)}, or pass {OVERSUBSCRIBE_OPTION} to share GPUs between workers"
        )
    position = index if slot is None else slot
    return {"CUDA_VISIBLE_DEVICES": devices[position % len(devices)]}


def apply_environment(changes: Mapping[str, str], environ: MutableMapping[str, str] | None = None) -> None:
    """Apply ``assign_device``'s changes; refuses once CUDA is initialised, when they do nothing.

    CUDA reads ``CUDA_VISIBLE_DEVICES`` once, at initialisation: setting it later would silently
    leave every worker on GPU 0, which is worse than an error.
    """
    target = os.environ if environ is None else environ
    if not changes:
        return
    torch = sys.modules.get("torch")  # CUDA can be initialised only once torch is imported; never import it here
    if "CUDA_VISIBLE_DEVICES" in changes and torch is not None and torch.cuda.is_initialized():
        current = target.get("CUDA_VISIBLE_DEVICES")
        if current != changes["CUDA_VISIBLE_DEVICES"]:
            raise RuntimeError(
                "CUDA is already initialised in this worker, so CUDA_VISIBLE_DEVICES can no "
                "longer change; assign devices in pytest_configure, before anything touches CUDA"
            )
    target.update(changes)


class DeviceSlots:
    """Controller-side book of which GPU slot each live worker holds.

    Acquire in ``pytest_configure_node`` (hand the slot to the worker via ``node.workerinput``)
    and release in ``pytest_testnodedown``; xdist reports a dead worker before it starts the
    replacement, so the replacement gets the freed GPU. Slots are handed out lowest first, so
    gw0..gwN-1 get slots 0..N-1 as documented.
    """

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def acquire(self, worker_id: str) -> int:
        if worker_id in self._held:
            return self._held[worker_id]
        taken = set(self._held.values())
        slot = next(i for i in range(len(taken) + 1) if i not in taken)
        self._held[worker_id] = slot
        return slot

    def release(self, worker_id: str) -> None:
        self._held.pop(worker_id, None)


SLOTS_KEY = pytest.StashKey[DeviceSlots]()  # config stash: the xdist controller's slots (xdist_hooks.py)
