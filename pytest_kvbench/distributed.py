"""Running a sweep on many GPUs and machines, and keeping a long sweep alive: the pure parts.

* One worker per GPU: ``assign_device`` tells an xdist worker which GPU to take (by narrowing
  ``CUDA_VISIBLE_DEVICES`` before CUDA initialises); ``DeviceSlots`` lets the controller give a
  replacement for a crashed worker the crashed worker's GPU; ``xdist_group_name`` names the
  ``xdist_group`` mark that keeps the items sharing a full-cache reference (one model, task,
  length and seed) on one worker under ``--dist loadgroup``.
* Across machines: ``parse_shard`` / ``select_shard`` implement ``--kvbench-shard K/N``.
* Health checks: ``check_logits_finite``, ``is_out_of_memory`` / ``free_accelerator_memory`` /
  ``fail_on_out_of_memory``, and ``item_time_limit`` turn the ways a GPU-day sweep dies into a
  failed item with a clear message, so the worker goes on to the next item.

Nothing here reads global state: callers pass the environment, device count and worker id, so
every function is tested without a GPU or xdist.
"""

from __future__ import annotations

import gc
import os
import re
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass

import torch

OVERSUBSCRIBE_OPTION = "--kvbench-allow-oversubscribe"
TIMEOUT_OPTION = "--kvbench-timeout"
SHARD_OPTION = "--kvbench-shard"


class UsageLikeError(ValueError):
    """A usage mistake with a one-line message; the plugin turns it into ``pytest.UsageError``."""


# --------------------------------------------------------------------------------------------
# One worker per GPU

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
    if "CUDA_VISIBLE_DEVICES" in changes and torch.cuda.is_initialized():
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


_GROUP_UNSAFE = re.compile(r"[^A-Za-z0-9._/+=-]")


def xdist_group_name(group: str) -> str:
    """The ``xdist_group`` name for a group of items (``Case.reference_group``), so that
    ``--dist loadgroup`` keeps them on one worker.

    Grouping by model alone would send a one-model sweep to a single worker; grouping by the
    reference a task's items share spreads tasks over workers while each full-cache reference
    is still computed once per run, and each worker loads only the models of its groups.

    xdist appends ``@<group>`` to node ids and splits on the last ``@`` after the last ``]``,
    so the name must contain neither; anything outside a conservative set becomes ``_``.
    """
    return "kvbench_" + _GROUP_UNSAFE.sub("_", group)


def parametrize_id(nodeid: str) -> str | None:
    """``path::test_ruler[snapkv-128-vt-ctx2048]`` (with or without xdist's ``@group``) -> the id."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        nodeid = nodeid[: nodeid.rfind("@")]
    start = nodeid.find("[", nodeid.rfind("::") + 2)
    if start < 0 or not nodeid.endswith("]"):
        return None
    return nodeid[start + 1 : -1]


def reference_group_scheduler(config, log, groups: Mapping[str, str]):
    """xdist's ``loadgroup`` scheduler, told each kvbench item's group directly.

    xdist passes ``xdist_group`` marks to the controller by appending ``@group`` to node ids in
    the workers; from pytest 9.2 that rename no longer takes effect (pytest-xdist issue #1386),
    and ``--dist loadgroup`` silently spreads a task's items over every worker. The controller
    knows the grid, so it maps each item's parametrize id to its group (``groups``) instead;
    items that are not kvbench cases keep xdist's own rule.
    """
    from xdist.scheduler import LoadGroupScheduling

    class ReferenceGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            group = groups.get(parametrize_id(nodeid) or "")
            return group if group is not None else super()._split_scope(nodeid)

    return ReferenceGroupScheduling(config, log)


# --------------------------------------------------------------------------------------------
# Across machines: --kvbench-shard K/N


def parse_shard(spec: str) -> tuple[int, int]:
    """``"2/3"`` -> ``(2, 3)``: 1-based part K of N; ValueError (one line) otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(spec))
    if match:
        k, n = int(match.group(1)), int(match.group(2))
        if n >= 1 and 1 <= k <= n:
            return k, n
    raise ValueError(f"{SHARD_OPTION} expects K/N with 1 <= K <= N (e.g. 2/3), got {spec!r}")


def shard_cuts(group_sizes: Sequence[int], n: int, slack: float = 0.1) -> list[int]:
    """Where to cut ``sum(group_sizes)`` items, laid out group after group, into ``n`` parts.

    Parts get an even share (sizes differ by at most one), except that a cut moves to a group
    boundary when every part stays within ``slack`` of a share (plus one item) of its even
    size: one model fewer to load on a machine is worth a slightly uneven split, a machine
    idling for hours is not. Returns ``n + 1`` non-decreasing offsets from 0 to the total.
    """
    if not 0 <= slack < 0.5:
        raise ValueError(f"slack must be in [0, 0.5), got {slack}")
    total = sum(group_sizes)
    boundaries = [0]
    for size in group_sizes:
        boundaries.append(boundaries[-1] + size)
    tolerance = int(slack * total / n + 1e-9)  # floor, robust to 0.3 * 210 / 9 = 7.000...1 vs 6.999...
    smallest, largest = total // n - tolerance, -(-total // n) + tolerance
    cuts = [0]
    for i in range(1, n):
        even = (i * total) // n
        candidates = sorted((b for b in boundaries if abs(b - even) <= tolerance), key=lambda b: (abs(b - even), b))
        cut = next((b for b in candidates if smallest <= b - cuts[-1] <= largest), even)
        cuts.append(max(cut, cuts[-1]))
    cuts.append(total)
    return cuts


def select_shard(items: Iterable, k: int, n: int, group_key: Callable[[object], object], *,
                 item_key: Callable[[object], object] | None = None, slack: float = 0.1) -> list:
    """Part ``k`` of ``n`` (1-based) of ``items``, keeping each group (model) together if possible.

    Deterministic and machine-independent (no ``hash()``, no randomness): groups are ordered by
    ``str(group_key(item))``, items inside a group by ``item_key`` (e.g. the node id; default:
    their given order), then the sequence is cut by ``shard_cuts``. Shards 1..n together hold
    every item exactly once. The selected items keep their original relative order.
    """
    if not (n >= 1 and 1 <= k <= n):
        raise ValueError(f"shard {k}/{n} is out of range: need 1 <= K <= N")
    items = list(items)
    groups: dict[str, list[int]] = {}
    for position, item in enumerate(items):
        groups.setdefault(str(group_key(item)), []).append(position)
    layout: list[int] = []
    sizes: list[int] = []
    for name in sorted(groups):
        members = groups[name]
        if item_key is not None:
            members = sorted(members, key=lambda p: (str(item_key(items[p])), p))
        layout.extend(members)
        sizes.append(len(members))
    cuts = shard_cuts(sizes, n, slack)
    chosen = set(layout[cuts[k - 1]:cuts[k]])
    return [item for position, item in enumerate(items) if position in chosen]


# --------------------------------------------------------------------------------------------
# Health: non-finite logits


class NonFiniteLogits(AssertionError):
    """NaN or inf in a model's logits: the item fails (its scores would be meaningless)."""


def check_logits_finite(logits: torch.Tensor, where: str) -> None:
    """Raise ``NonFiniteLogits`` naming ``where`` and how many NaN / inf values there are.

    One ``isfinite().all()`` on the happy path; the counting only happens on failure.
    """
    finite = torch.isfinite(logits)
    if bool(finite.all()):
        return
    nan = int(torch.isnan(logits).sum())
    inf = int(torch.isinf(logits).sum())
    first = tuple(int(i) for i in (~finite).nonzero()[0].tolist())
    raise NonFiniteLogits(
        f"non-finite logits in {where}: {nan} NaN and {inf} inf among {logits.numel()} values "
        f"(first at index {first}, shape {tuple(logits.shape)}, dtype {str(logits.dtype).replace('torch.', '')})"
    )


# --------------------------------------------------------------------------------------------
# Health: out of memory

_TORCH_OOM = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
_OOM_PHRASES = ("out of memory", "can't allocate memory", "cublas_status_alloc_failed")


class ItemOutOfMemory(AssertionError):
    """The item ran out of (accelerator) memory; memory was freed and the worker goes on."""


def is_out_of_memory(exc: BaseException) -> bool:
    """True for torch's ``OutOfMemoryError``, ``MemoryError`` and "out of memory" RuntimeErrors.

    Follows ``__cause__`` / unsuppressed ``__context__``: libraries sometimes re-raise an OOM
    wrapped in their own exception.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (_TORCH_OOM, MemoryError, ItemOutOfMemory)):
            return True
        if isinstance(current, RuntimeError) and any(p in str(current).lower() for p in _OOM_PHRASES):
            return True
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return False


def free_accelerator_memory() -> None:
    """Collect garbage, then return cached GPU blocks to the driver so the next item starts clean."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class _OutOfMemoryGuard:
    def __init__(self, where: str) -> None:
        self.where = where

    def __enter__(self) -> _OutOfMemoryGuard:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or not is_out_of_memory(exc):
            return False
        message = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        # The traceback's frames hold the activations that filled the GPU; clear them, or
        # empty_cache() cannot give anything back while this exception is alive.
        traceback.clear_frames(tb)
        free_accelerator_memory()
        raise ItemOutOfMemory(f"out of memory in {self.where}: {message}") from None


def fail_on_out_of_memory(where: str) -> _OutOfMemoryGuard:
    """Context manager: an out-of-memory error inside becomes ``ItemOutOfMemory`` (a failure)
    after the memory it held is freed; any other exception passes through unchanged."""
    return _OutOfMemoryGuard(where)


# --------------------------------------------------------------------------------------------
# Health: per-item time limit


class ItemTimeout(TimeoutError):
    """The item ran past its time limit."""


@dataclass
class TimeLimit:
    """What ``item_time_limit`` did: ``enforced`` is False where it could not arm a timer."""

    seconds: float | None
    enforced: bool
    reason: str = ""


def _alarm_unavailable() -> str:
    if not hasattr(signal, "setitimer") or not hasattr(signal, "SIGALRM"):
        return "this platform has no SIGALRM"
    if threading.current_thread() is not threading.main_thread():
        return "signals can only be handled in the main thread"
    return ""


class item_time_limit:  # noqa: N801 - used like contextlib's lowercase context managers
    """Raise ``ItemTimeout`` in the main thread once ``seconds`` have passed inside the block.

    Uses ``signal.setitimer`` + ``SIGALRM`` (POSIX, main thread; xdist runs tests there). It is a
    documented no-op (``TimeLimit.enforced`` False, with the reason) for ``None`` / ``<= 0``, off
    the main thread, on platforms without ``SIGALRM``, and when an earlier-firing ``SIGALRM``
    timer (e.g. pytest-timeout's) is already set, which is left alone. Python handles the
    signal between bytecodes, so one long CUDA/C call finishes before the item stops. A timer
    that was set before is restored with its remaining time on exit.
    """

    def __init__(self, seconds: float | None, where: str = "item") -> None:
        self.seconds = seconds
        self.where = where
        self._previous_handler = None
        self._previous_timer: tuple[float, float] = (0.0, 0.0)
        self._started = 0.0
        self.status = TimeLimit(seconds, enforced=False)

    def __enter__(self) -> TimeLimit:
        if self.seconds is None or self.seconds <= 0:
            self.status.reason = "no time limit set"
            return self.status
        reason = _alarm_unavailable()
        if reason:
            self.status.reason = reason
            return self.status
        previous = signal.getitimer(signal.ITIMER_REAL)
        if 0 < previous[0] <= self.seconds:
            self.status.reason = "an earlier SIGALRM timer is already set"
            return self.status
        self._previous_timer = previous
        self._previous_handler = signal.signal(signal.SIGALRM, self._on_alarm)
        self._started = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, self.seconds)
        self.status.enforced = True
        return self.status

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not self.status.enforced:
            return False
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._previous_handler)
        delay, interval = self._previous_timer
        if delay > 0:
            remaining = delay - (time.monotonic() - self._started)
            signal.setitimer(signal.ITIMER_REAL, max(remaining, 1e-6), interval)
        if isinstance(exc, ItemTimeout):
            # The alarm can land on an instruction that has no line number (CPython 3.11), and pytest then
            # fails to render the traceback: an INTERNALERROR instead of a failed item. A fresh exception
            # raised here carries only frames with known lines.
            raise ItemTimeout(str(exc)) from None
        return False

    def _on_alarm(self, signum, frame) -> None:
        raise ItemTimeout(f"{self.where} exceeded its time limit of {self.seconds:g} s ({TIMEOUT_OPTION})")
