"""A multi-token forward's sliding-window layers attend chunk by chunk over their band of keys, not over all of them.

transformers' sdpa hands a sliding layer the whole [queries x keys] boolean mask of its window and torch's CPU
kernels compute every score under it: at 8,192 prompt tokens gemma3-270m's 15 sliding layers (window 512)
computed 8,192 x 8,192 scores per head to use 512 of each row, and the shared prefill spent 62% of a sample
there (docs/performance.md). A query only sees keys inside its window, so the queries can be cut into chunks
of `chunk_queries(window)` rows, each attending over the keys its rows can see: the chunk's own and the
`window - 1` before it. The band is read off the mask itself (the first and last column any row of the chunk
may see, over the batch), so padding, a cache that already holds tokens (chunked prefill, the question after
the context) and per-layer masks are honoured as they are; the columns left out are masked in every row of the
chunk and weigh nothing. The result is sdpa's up to float rounding (a shorter softmax).

It plugs in without touching a model's attention forward: `banded_attention(model)` names a function registered
with transformers' public AttentionInterface for the forwards inside, when the model runs transformers' sdpa and
has sliding layers (kvmethods' own description says which, attention/model_probe.py). Global layers, one-query
forwards, forwards no longer than a chunk and masks that are not boolean go to transformers' sdpa unchanged, bit
for bit. When the queries are being captured (query_capture.py: the shared prefill's hooks of families whose
queries only the attention call knows), the capture stays outside and calls the banded function, so it keeps
each layer's whole queries.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from .attention_hooks import attention_function
from .model_probe import sliding_windows
from .query_capture import PREFIX as CAPTURE_PREFIX
from .query_capture import wrapping_instead
from ..core.errors import MethodError
from ..adapters.transformers_compat import (attention_implementation, register_attention, sdpa_attention_forward,
                                            sdpa_mask)

ATTENTION_NAME = "kvbench_banded_sdpa"  # the name registered with transformers' AttentionInterface
SDPA = "sdpa"
# Query rows per chunk at most. Per chunk the scores are rows x (rows + window - 1): fewer rows compute fewer masked
# scores, more rows make fewer calls. One sliding layer of gemma3-270m at 8,192 tokens on one CPU thread (4 query
# heads of 256, window 512): sdpa over the whole mask 3.9 s; chunks of 64 rows 0.32 s, 128 0.35 s, 256 0.44 s,
# 512 0.54 s.
MAX_CHUNK_QUERIES = 128


def chunk_queries(window: int) -> int:
    return max(1, min(MAX_CHUNK_QUERIES, window))


@dataclass
class _Banding:
    """The active forwards' sliding windows by layer, and the bands of the latest mask (the sliding layers of one
    forward share one mask tensor: its bands are read once)."""

    windows: dict[int, int]
    mask: torch.Tensor | None = None  # the mask the bands were read from, and with which key length and rows
    shape: tuple[int, int] = (0, 0)
    bands: list[tuple[int, int, int, int]] = field(default_factory=list)

    def bands_of(self, mask: torch.Tensor, keys: int, rows: int) -> list[tuple[int, int, int, int]]:
        if mask is not self.mask or self.shape != (keys, rows):
            self.mask, self.shape, self.bands = mask, (keys, rows), query_bands(mask[..., :keys], rows)
        return self.bands


_active: ContextVar = ContextVar("kvbench_banded_attention", default=None)


def query_bands(mask: torch.Tensor, rows: int) -> list[tuple[int, int, int, int]]:
    """(first query, end query, first key, end key) of each chunk of `rows` queries of a boolean mask
    [batch, 1 or heads, queries, keys]: the keys any query of the chunk may see in any row of the batch (every key,
    where a chunk sees none: sdpa's own answer for fully masked rows then)."""
    queries, keys = mask.shape[-2:]
    bands = []
    for start in range(0, queries, rows):
        end = min(queries, start + rows)
        seen = mask[..., start:end, :].reshape(-1, end - start, keys).any(dim=1).any(dim=0).nonzero()
        first, last = (int(seen[0]), int(seen[-1]) + 1) if len(seen) else (0, keys)
        bands.append((start, end, first, last))
    return bands


def banded_sdpa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, **kwargs):
    """A transformers attention function: a sliding layer's multi-token forward under a boolean mask, chunk by
    chunk over each chunk's band of keys (transformers' sdpa per chunk); any other call, transformers' sdpa.
    `dropout` is a named positional parameter, as in transformers' own attention functions: a wrapper that passes it
    by position (kvpress's attention patch does) must reach it."""
    kwargs["dropout"] = dropout
    banding: _Banding | None = _active.get()
    window = banding.windows.get(getattr(module, "layer_idx", None)) if banding is not None else None
    rows = chunk_queries(window) if window is not None else 0
    if (window is None or attention_mask is None or attention_mask.dtype != torch.bool or attention_mask.dim() != 4
            or query.shape[2] <= rows or kwargs.get("position_bias") is not None):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    keys = key.shape[-2]  # the mask sliced to the keys, as transformers' sdpa slices it
    outputs = [sdpa_attention_forward(module, query[:, :, start:end], key[:, :, first:last], value[:, :, first:last],
                                      attention_mask[:, :, start:end, first:last], **kwargs)[0]
               for start, end, first, last in banding.bands_of(attention_mask, keys, rows)]
    return torch.cat(outputs, dim=1), None  # [batch, queries, heads, dim], as sdpa's


register_attention(ATTENTION_NAME, banded_sdpa_attention, sdpa_mask)  # sdpa's masks: the bands are read off them


def _windows(model) -> dict[int, int]:
    try:
        return {index: window for index, window in enumerate(sliding_windows(model)) if window is not None}
    except MethodError:  # a family kvmethods cannot describe: no window known, sdpa as it is
        return {}


@contextmanager
def banded_attention(model) -> Iterator[None]:
    """While active, the model's sliding layers attend over their bands in multi-token forwards, when the model
    runs transformers' sdpa (also under a query capture of it); any other model is left as it is."""
    current = attention_implementation(model)
    windows = _windows(model) if current in (SDPA, CAPTURE_PREFIX + SDPA) else {}
    if not windows:
        yield
        return
    if current == SDPA:
        with attention_function(model, ATTENTION_NAME, _active, _Banding(windows)):
            yield
        return
    token = _active.set(_Banding(windows))
    try:
        with wrapping_instead(SDPA, ATTENTION_NAME):  # the capture calls the banded function in sdpa's place
            yield
    finally:
        _active.reset(token)
