"""Composition: one eviction method and one quantizer as a single method, `snapkv+kivi:bits=4`.
(ThinK, think.py, counts as the storage part too: `snapkv+think`.)

The eviction method chooses the kept tokens during the prefill exactly as it does alone; the quantizer
then stores them (KIVI: keys per channel, values per token, a full-precision window). The grid names the
pair once, so it has one item id, one record and one table row. Parameters go to the part that declares
them; a parameter both parts declare is written `part.name=value` (`snapkv+kivi:kivi.group_size=64`),
and the record's params are prefixed the same way (`snapkv.window`, `kivi.bits`). Under a byte budget
the pair keeps the most tokens whose quantized storage fits (memory_budget.py).

A composition needs exactly one quantizer and at most one eviction method; two quantizers, two
eviction methods, the full cache or a head-adaptive (ragged) eviction method are MethodErrors, which
the grid turns into one-line usage errors before any model loads.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import Method
from .delegation import Delegating
from .errors import MethodError

SEPARATOR = "+"


class Composition(Delegating):
    """Selection is the evictor's (`inner`); storage and its byte count are the quantizer's."""

    def __init__(self, evictor: Method, quantizer: Method, name: str):
        super().__init__(evictor, name)
        self.quantizer = quantizer
        self.quantizes = True
        self.query_window = quantizer.query_window

    def params(self) -> dict:
        return {f"{part.name}.{key}": value for part in (self.inner, self.quantizer)
                for key, value in part.params().items()}

    def storage_layer(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor | None = None):
        return self.quantizer.storage_layer(keys, values, queries)

    def stored_bytes(self, tokens: int, heads: int, head_dim: int, element_size: int) -> int:
        return self.quantizer.stored_bytes(tokens, heads, head_dim, element_size)


def _routed(parts: list[type[Method]], params: dict[str, Any], spec: str) -> list[dict[str, Any]]:
    """Each parameter to the one part that declares it (or that its `part.` prefix names)."""
    routed: list[dict[str, Any]] = [{} for _ in parts]
    names = [cls.name for cls in parts]
    for key, value in params.items():
        prefix, dot, bare = key.partition(".")
        if dot:
            if prefix not in names:
                raise MethodError(f"{spec}: parameter {key!r} names no part of the composition ({', '.join(names)})")
            routed[names.index(prefix)][bare] = value
            continue
        owners = [i for i, cls in enumerate(parts) if key in cls.__dataclass_fields__]
        if len(owners) > 1:
            raise MethodError(f"{spec}: parameter {key!r} belongs to several parts; write it as "
                              + " or ".join(f"{names[i]}.{key}" for i in owners))
        if not owners:
            valid = "; ".join(f"{cls.name}: {cls.describe_params()}" for cls in parts)
            raise MethodError(f"{spec}: unknown parameter {key!r}; valid parameters: {valid}")
        routed[owners[0]][key] = value
    return routed


def compose(spec: str, params: dict[str, Any], load) -> Composition:
    """The Composition named `a+b` (load: name -> Method class), parameters routed to its parts."""
    names = [part.strip() for part in spec.split(SEPARATOR)]
    if len(names) != 2 or not all(names):
        raise MethodError(f"{spec}: a composition is one eviction method and one quantizer, like 'snapkv+kivi'")
    classes = [load(name) for name in names]
    methods = [cls.from_params(**kwargs) for cls, kwargs in zip(classes, _routed(classes, params, spec))]
    quantizers = [m for m in methods if m.quantizes]
    evictors = [m for m in methods if not m.quantizes]
    if len(quantizers) != 1:
        raise MethodError(f"{spec}: a composition needs exactly one quantizer, got {len(quantizers)} "
                          f"({', '.join(m.name for m in quantizers) or 'none'}); a cache is quantized once")
    evictor = evictors[0]
    if not evictor.compresses:
        raise MethodError(f"{spec}: {evictor.name} evicts nothing; name the quantizer alone ({quantizers[0].name})")
    if evictor.name == "adakv":
        raise MethodError(f"{spec}: adakv stores a ragged cache, which {quantizers[0].name} cannot quantize")
    return Composition(evictor, quantizers[0], spec)
