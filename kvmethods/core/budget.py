"""KV budgets: how many prompt tokens each layer keeps, in the two conventions papers use.

An absolute budget ("1024") is the number of KV tokens kept per layer per KV head, observation window
included; this is how the LongBench tables of SnapKV/PyramidKV are labelled (128/512/1024/2048).
A ratio budget ("r0.5") is the fraction of the prompt removed, as in kvpress' `compression_ratio`.
A byte budget ("m0.25") is the fraction of the full cache's bytes a method may store; each method turns
it into its own operating point (memory_budget.py: eviction keeps fewer tokens, a quantizer stores every
token at fewer bits, a composition keeps as many quantized tokens as fit), so one table compares
methods at equal memory. The spellings differ so that item ids never confuse them. A budget at or
above the prompt length means no compression.

``FULL_CACHE`` ("full") is the one spelling of no compression: every token kept. It is the budget of the
uncompressed reference (the `full` method's row, run once per task) and of anything that must not compress.
"""

from __future__ import annotations

import math
import reprlib
import re
from dataclasses import dataclass
from decimal import Decimal

from .errors import MethodError

_TOKENS = re.compile(r"^[0-9]+$")
_RATIO = re.compile(r"^r([0-9]*\.?[0-9]+)$")
_MEMORY = re.compile(r"^m([0-9]*\.?[0-9]+)$")
_HELP = ("use a positive token count like '1024', a removed fraction like 'r0.5' (0 <= r < 1) or a fraction "
         "of the full cache's bytes like 'm0.25' (0 < m <= 1)")


def _decimal(value: float) -> str:
    """The shortest decimal that reads back as `value`, without an exponent: r0.5, m1, r0.00001 (``:g`` gave
    r1e-05, which the grammar does not read, and r0.123457 for 0.123456789, a different budget)."""
    return format(Decimal(repr(float(value))).normalize(), "f")


@dataclass(frozen=True)
class Budget:
    kind: str  # "tokens" | "ratio" | "memory" | "none" (FULL_CACHE)
    value: float | int | None

    @property
    def spec(self) -> str:
        """Canonical spelling, used in item ids and records."""
        if self.kind == "none":
            return "full"
        if self.kind == "tokens":
            return str(self.value)
        return f"{'m' if self.kind == 'memory' else 'r'}{_decimal(self.value)}"

    @classmethod
    def parse(cls, raw: Budget | int | str) -> Budget:
        if isinstance(raw, Budget):
            return raw
        if isinstance(raw, bool) or not isinstance(raw, (int, str)):
            raise MethodError(f"invalid budget {reprlib.repr(raw)} ({type(raw).__name__}): {_HELP}")
        text = str(raw).strip()
        if text == FULL_CACHE.spec:
            return FULL_CACHE
        if _TOKENS.match(text):
            tokens = int(text)
            if tokens <= 0:
                raise MethodError(f"invalid budget {reprlib.repr(raw)}: a token budget must be at least 1; {_HELP}")
            return cls("tokens", tokens)
        ratio = _RATIO.match(text)
        if ratio:
            removed = float(ratio.group(1))
            if not 0.0 <= removed < 1.0:
                raise MethodError(f"invalid budget {reprlib.repr(raw)}: the removed fraction must be in [0, 1); {_HELP}")
            return cls("ratio", removed)
        memory = _MEMORY.match(text)
        if memory:
            fraction = float(memory.group(1))
            if not 0.0 < fraction <= 1.0:
                raise MethodError(f"invalid budget {reprlib.repr(raw)}: the fraction of the full cache's bytes must be in (0, 1]; {_HELP}")
            return cls("memory", fraction)
        raise MethodError(f"invalid budget {reprlib.repr(raw)}: {_HELP}")

    def tokens_for(self, prompt_len: int) -> int:
        """KV tokens each layer keeps (on average, for per-layer schedules) for a prompt of this length.
        A byte budget's tokens depend on the method and the model: memory_budget.operating_point."""
        if self.kind == "memory":
            raise MethodError("a byte budget has no token count of its own: use memory_budget.operating_point")
        if prompt_len <= 0:
            return 0
        if self.kind == "none":
            return prompt_len
        if self.kind == "tokens":
            return min(int(self.value), prompt_len)
        kept = math.floor(prompt_len * (1.0 - self.value) + 1e-9)
        return max(1, min(kept, prompt_len))

    @property
    def sort_key(self) -> tuple[int, float]:
        """The full cache first, then token budgets ascending, then ratio budgets from the most removed to the
        least, then byte budgets from the smallest."""
        if self.kind == "none":
            return (-1, 0.0)
        if self.kind == "memory":
            return (2, float(self.value))
        return (0, float(self.value)) if self.kind == "tokens" else (1, -float(self.value))

    def as_record(self) -> dict:
        return {"spec": self.spec, "kind": self.kind, "value": self.value}


FULL_CACHE = Budget("none", None)  # no compression: every prompt token kept
