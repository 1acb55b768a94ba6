"""The one clock of the runtime: wall time that means what it says on a GPU.

CUDA kernels run asynchronously. A clock read right after a forward returns measures the time it took to
queue the forward's kernels, not to run them; the wait then lands in whichever later step first needs a
result (the first decoded token, another method's scoring). Seen on an H200: a 32k-token prefill of a
model of Llama-3-8B's shape "took" 86 ms. Every timer of the runtime (prefill, scoring, selection, decode,
item wall time) therefore reads `now()`, which first waits for the work queued on the current CUDA device.
Where CUDA is not in use (CPU runs) it is `time.perf_counter()` and costs nothing more.
"""

from __future__ import annotations

import time

import torch


def now() -> float:
    """Seconds on a monotonic clock, after the current CUDA device has finished its queued work."""
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()
