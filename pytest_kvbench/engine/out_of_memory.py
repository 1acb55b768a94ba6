"""Out of memory fails the item, not the worker: memory is freed and the sweep goes on.

``fail_on_out_of_memory`` turns an out-of-memory error inside it into ``ItemOutOfMemory`` after
releasing the traceback's frames (they hold the activations that filled the GPU) and returning
cached GPU blocks to the driver.
"""

from __future__ import annotations

import gc
import traceback

import torch

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
