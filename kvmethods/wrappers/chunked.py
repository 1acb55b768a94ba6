"""Chunked prefill with eviction: `snapkv:prefill_chunk=512` prefills the prompt 512 tokens at a time and
compresses the cache after each chunk, so the cache never holds more than budget + chunk tokens and peak
memory follows them instead of the whole prompt (the setting of e.g. SnapKV's and PyramidKV's long-context
follow-ups, and of serving engines that prefill in chunks).

Later chunks attend to the compressed cache, not to the whole prompt, and the method scores each chunk's
keys with that chunk's queries: results differ from a one-shot prefill, so the chunk is part of the
method's identity (a parameter: in the item id, the record's params and the baseline key). With
`prefill_chunk` 0 (the default) or at least the prompt length, the prefill is exactly the one-shot one.
Methods that score the whole prompt at once (kvzip), that run their own prefill (kvpress) or that store a
ragged cache (adakv) cannot be chunked (capabilities.can_prefill_in_chunks): a MethodError, hence a usage
error at collection.
"""

from __future__ import annotations

from ..core.base import Method
from ..core.capabilities import Capability, can_prefill_in_chunks
from ..core.catalog import PREFILL_CHUNK as PARAMETER
from .delegating_wrapper import Delegating
from ..core.errors import MethodError
from ..core.params import coerce


class Chunked(Delegating):
    """`inner` with its prompt prefilled `prefill_chunk` tokens at a time (generation.prefill reads it)."""

    def __init__(self, inner: Method, prefill_chunk: int):
        super().__init__(inner, inner.name)
        self.capabilities |= Capability.CHANGES_PREFILL  # later chunks attend to the compressed cache
        self.prefill_chunk = prefill_chunk

    def params(self) -> dict:
        return self.inner.params() | {PARAMETER: self.prefill_chunk}


def chunked(method: Method, value) -> Method:
    """The method with a chunked prefill (`value` tokens per chunk; 0 leaves it unchanged)."""
    chunk = coerce(method.name, PARAMETER, int, value)
    if chunk < 0:
        raise MethodError(f"{method.name}: parameter {PARAMETER!r} must be >= 0, got {chunk}")
    if chunk == 0:
        return method
    if not can_prefill_in_chunks(method.capabilities):
        raise MethodError(f"{method.name}: cannot prefill in chunks (it must evict from the cache layer by "
                          f"layer during the prefill)")
    return Chunked(method, chunk)
