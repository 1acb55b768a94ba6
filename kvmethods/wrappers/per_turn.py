"""Re-compression after each turn: `snapkv:per_turn=true` cuts a multi-turn cache back to its budget.

Issue 17's multi-turn protocol compresses the context at the first prefill "and, if the method says so,
again after each turn". Without it the history grows by every question and answer, so a budget bounds the
context only; SCBench (Li et al. 2024, arXiv 2412.10319) measures both settings. With `per_turn=true` the
method's own scorer cuts every layer back to the budget once a turn's answer is in, the turn's question and
answer serving as its observation window (the queries kvpress' DecodingPress and R-KV score with: the most
recent tokens), so the cache holds at most budget + the next question when a turn starts.

Because the re-compression changes what later turns see, it is part of the method's identity: a parameter
in the item id, the record's params and the baseline key. `per_turn=false` (the default) is the method
unchanged. Only methods that can cut a grown cache back from recent queries can do it (as for `decoding`):
not those needing every prompt query (h2o), the whole prompt (kvzip), their own prefill (kvpress), uneven
heads (adakv) or a storage of their own (capabilities.can_cut_back_from_recent_queries). The protocol side
is protocols/multi_turn.py; the grid refuses the parameter under any other protocol (wiring/grid/cache_protocols.py).
"""

from __future__ import annotations

import copy
import dataclasses

from ..core.base import Method
from ..core.capabilities import Capability, can_cut_back_from_recent_queries
from ..core.catalog import PER_TURN as PARAMETER
from .delegating_wrapper import Delegating
from .score_wrapper import WrapperMethod
from ..core.errors import MethodError
from ..core.params import coerce


class PerTurn(Delegating):
    """`inner`, cut back to its budget after every turn of a multi-turn session."""

    def __init__(self, inner: Method):
        super().__init__(inner, inner.name)
        self.capabilities |= Capability.RECOMPRESSES_PER_TURN

    def params(self) -> dict:
        return self.inner.params() | {PARAMETER: True}

    def while_decoding(self, model, state):
        return self.inner.while_decoding(model, state)

    def observing(self, tokens: int) -> Method:
        """The scorer for a turn of `tokens` fed tokens: a `window` longer than the turn shrinks to it."""
        return observing(self.inner, tokens)


def observing(method: Method, tokens: int) -> Method:
    """`method` with a `window` longer than `tokens` shrunk to them: its own, or its base's for a wrapper
    (`criticalkv`, `chunkkv`, `merge` over snapkv), the wrapper copied around the shrunk base."""
    window = getattr(method, "window", None)
    if isinstance(window, int) and window > tokens and dataclasses.is_dataclass(method):
        return dataclasses.replace(method, window=max(1, tokens))
    if isinstance(method, WrapperMethod):
        inner = observing(method.inner, tokens)
        if inner is not method.inner:
            wrapper = copy.copy(method)
            wrapper.inner = inner
            return wrapper
    return method


def per_turn(method: Method, value) -> Method:
    """The method re-compressing after each turn (`value` true), else unchanged; MethodError when it cannot."""
    if not coerce(method.name, PARAMETER, bool, value):
        return method
    if not can_cut_back_from_recent_queries(method.capabilities):
        raise MethodError(f"{method.name}: cannot re-compress after each turn (per_turn needs a method that cuts "
                          f"the cache back layer by layer from recent queries, as decoding's bases do)")
    return PerTurn(method)
