"""Composition: an eviction method, ThinK and/or a quantizer as a single method, `snapkv+think+kivi:bits=4`.

The eviction method chooses the kept tokens during the prefill exactly as it does alone; the storage parts
then store them: ThinK (think.py) prunes key channels, a quantizer (KIVI: keys per channel, values per
token, a full-precision window) quantizes. With both, the thin keys are what KIVI quantizes and the
full-precision window keeps every channel, as in the ThinK reference's KIVI variant; ThinK's own `recent`
window then does not apply (KIVI's `residual` is the window) and naming it is an error. The grid names the
composition once, so it has one item id, one record and one table row. Parameters go to the part that
declares them; a parameter several parts declare is written `part.name=value`
(`snapkv+think+kivi:think.window=16`), and the record's params are prefixed the same way (`snapkv.window`,
`kivi.bits`). Under a byte budget the composition keeps the most tokens whose stored bytes fit
(memory_budget.py); ThinK's ratio and the quantizer's bits stay as given.

A composition has two or three parts: at most one eviction method, at most one ThinK, at most one quantizer,
and ThinK or a quantizer to store the tokens. Two quantizers, two eviction methods, the full cache, a
head-adaptive (ragged) eviction method or a quantizer that cannot take thin keys with ThinK are MethodErrors,
which the grid turns into one-line usage errors before any model loads.
"""

from __future__ import annotations

import torch

from ..core.base import Method
from ..core.capabilities import Capability
from ..core.catalog import SEPARATOR
from .delegating_wrapper import Delegating
from ..core.errors import MethodError
from ..core.params import declared_params
from ..spec import MethodSpec

THINK_WINDOW = "recent"  # ThinK's full-channel window, replaced by the quantizer's own under think+kivi
STORAGE_ROLES = Capability.PRUNES_CHANNELS | Capability.TAKES_CHANNELS  # what a part is, not the composition


def _is_evictor(method: type[Method] | Method) -> bool:
    return Capability.OWN_STORAGE not in method.capabilities


def _is_thinner(method: type[Method] | Method) -> bool:
    return Capability.PRUNES_CHANNELS in method.capabilities


def _is_quantizer(method: type[Method] | Method) -> bool:
    return Capability.OWN_STORAGE in method.capabilities and not _is_thinner(method)


class Composition(Delegating):
    """Selection is the evictor's (`inner`, else the storage part: nothing is evicted); storage and its
    byte count are the thinner's (ThinK) and/or the quantizer's."""

    def __init__(self, parts: list[Method], evictor: Method | None, thinner: Method | None,
                 quantizer: Method | None, name: str):
        super().__init__(evictor or thinner or quantizer, name)
        self.parts, self.thinner, self.quantizer = parts, thinner, quantizer
        self.capabilities = (self.capabilities & ~STORAGE_ROLES) | Capability.OWN_STORAGE
        if thinner is not None:  # ThinK's storage reads the prompt's last queries: the composition's does
            self.capabilities |= Capability.READS_LAST_QUERIES
        self.query_window = thinner.query_window if thinner else 0

    def params(self) -> dict:
        return {f"{part.name}.{key}": value for part in self.parts for key, value in part.params().items()
                if not (part is self.thinner and self.quantizer and key == THINK_WINDOW)}

    def storage_layer(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor | None = None):
        if self.quantizer is None:
            return self.thinner.storage_layer(keys, values, queries)
        if self.thinner is None:
            return self.quantizer.storage_layer(keys, values, queries)
        channels = self.thinner.kept_channel_indices(keys, queries)
        return self.quantizer.storage_layer(keys, values, channels=channels)

    def stored_bytes(self, tokens: int, heads: int, head_dim: int, element_size: int) -> int:
        if self.quantizer is None:
            return self.thinner.stored_bytes(tokens, heads, head_dim, element_size)
        if self.thinner is None:
            return self.quantizer.stored_bytes(tokens, heads, head_dim, element_size)
        return self.quantizer.stored_bytes(tokens, heads, head_dim, element_size,
                                           kept_channels=self.thinner.kept_channels(head_dim))


def _at_most_one(role: str, methods: list[Method], spec: str, why: str) -> Method | None:
    if len(methods) > 1:
        raise MethodError(f"{spec}: a composition takes at most one {role}, got {len(methods)} "
                          f"({', '.join(m.name for m in methods)}); {why}")
    return methods[0] if methods else None


def _one_per_role(classes: list[type[Method]], spec: str) -> None:
    """The roles checked on the classes, before any part is built: two quantizers are refused as such even
    when building one of them would fail for another reason (a backend not installed)."""
    roles = {"eviction method": [c for c in classes if _is_evictor(c)],
             "think": [c for c in classes if _is_thinner(c)],
             "quantizer": [c for c in classes if _is_quantizer(c)]}
    for role, members in roles.items():
        if len(members) > 1:
            raise MethodError(f"{spec}: a composition takes at most one {role}, got {len(members)} "
                              f"({', '.join(c.name for c in members)})")


def compose(named: MethodSpec, load, build) -> Composition:
    """The Composition `named` names, `a+b` or `a+b+c` (load: name -> Method class; build: spec -> Method),
    its parameters routed to its parts (spec.py). Two or three parts with at most one per role always
    include ThinK or a quantizer to store the tokens."""
    spec = named.name  # as written, in messages
    classes = [load(name) for name in named.parts]
    _one_per_role(classes, spec)
    parts = named.routed([(cls.name, declared_params(cls)) for cls in classes])
    methods = [build(part) for part in parts]
    evictor = _at_most_one("eviction method", [m for m in methods if _is_evictor(m)], spec,
                           "they would each choose the kept tokens")
    thinner = _at_most_one("think", [m for m in methods if _is_thinner(m)], spec, "keys are thinned once")
    quantizer = _at_most_one("quantizer", [m for m in methods if _is_quantizer(m)], spec,
                             "a cache is quantized once")
    if evictor is not None and Capability.COMPRESSES not in evictor.capabilities:
        raise MethodError(f"{spec}: {evictor.name} evicts nothing; name the storage alone "
                          f"({SEPARATOR.join(m.name for m in methods if m is not evictor)})")
    if evictor is not None and Capability.HEAD_ADAPTIVE in evictor.capabilities:
        raise MethodError(f"{spec}: {evictor.name} stores a ragged cache, which {(thinner or quantizer).name} "
                          f"cannot store")
    if thinner is not None and quantizer is not None:
        if Capability.TAKES_CHANNELS not in quantizer.capabilities:
            raise MethodError(f"{spec}: {quantizer.name} cannot quantize think's thin keys; use kivi")
        if THINK_WINDOW in parts[methods.index(thinner)]:
            raise MethodError(f"{spec}: think's {THINK_WINDOW!r} does not apply with {quantizer.name}, whose "
                              f"full-precision window keeps every key channel")
    # one name per composition whatever the order given (`kivi+snapkv` is `snapkv+kivi`): eviction, think, quantizer
    name = SEPARATOR.join(m.name for m in (evictor, thinner, quantizer) if m is not None)
    return Composition(methods, evictor, thinner, quantizer, name)
