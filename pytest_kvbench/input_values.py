"""How every user-given list and number is read: one splitting rule, one integer rule, one bound per kind.

Options, ini keys, TOML keys, ``--kvbench-shard``, tolerances and ``kvbench`` arguments all go through
here, so a value is refused the same way wherever it appears (issue 31):

- a list element that is empty (``full,,snapkv``, ``128,``, a repeated option given ``''``) is refused,
  never dropped: dropping it would run a grid other than the one typed;
- integers are ASCII digits only (Python's ``int()`` also reads ``'١٢'`` and ``'1_0'``);
- every count has an upper bound, so a 20-digit value is a usage error, not a collection that grows
  until memory runs out. The bounds are far above any real benchmark and far below what hangs.

Pure Python (no torch): the plugin reads these at configure, in every pytest run of its users.
"""

from __future__ import annotations

import os
import re
from typing import Any

# samples per task: the largest suites' tasks hold a few thousand samples; a million is far above any
# dataset and still small enough that collection stays instant
MAX_SAMPLES = 1_000_000
# tokens (context lengths, prompt lengths): 10M is the longest context window any model advertises today
MAX_TOKENS = 10_000_000
# --kvbench-shard N: one part per machine; 10,000 machines is beyond any cluster this runs on
MAX_SHARDS = 10_000
# --kvbench-decode-batch N: members of a sample decoding in one batch; far above any grid's methods x budgets
MAX_DECODE_BATCH = 1024

_ASCII_INT = re.compile(r"\+?[0-9]+", re.ASCII)
_ASCII_NUMBER = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


class InputError(ValueError):
    """A value that cannot be used; the message is one line saying where it came from and what is valid."""


def split_list(value: Any, where: str) -> list:
    """Comma-separated strings, repeated options and TOML arrays as one flat list of stripped elements.

    An empty element anywhere (``a,,b``, ``a,``, a repeated option given ``''``) is an InputError naming
    ``where``; non-string elements (TOML integers, method tables) pass through unchanged."""
    items = value if isinstance(value, (list, tuple)) else [value]
    out: list = []
    for item in items:
        if not isinstance(item, str):
            out.append(item)
            continue
        parts = [part.strip() for part in item.split(",")]
        if not all(parts):
            given = ", ".join(shown(i) for i in items) if len(items) > 1 else shown(item)
            raise InputError(f"{where} has an empty element in {given}; remove the extra comma or empty value")
        out.extend(parts)
    return out


def ascii_int(text: Any, where: str, *, minimum: int, maximum: int) -> int:
    """An integer in [minimum, maximum] written in ASCII digits (TOML integers accepted as they are)."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    elif isinstance(text, str) and _ASCII_INT.fullmatch(text.strip()) and \
            len(text.strip().lstrip("+").lstrip("0")) <= len(str(maximum)):  # never int() of a 5,000-digit string
        value = int(text.strip())
    else:
        value = None
    if value is None or not minimum <= value <= maximum:
        what = f"a positive integer up to {maximum:,}" if minimum == 1 else f"an integer from {minimum} to {maximum:,}"
        raise InputError(f"{where} must be {what} (ASCII digits), got {shown(text)}")
    return value


def shown(value: Any, limit: int = 40) -> str:
    """``repr(value)``, cut to about ``limit`` characters so that a refusal stays one readable line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(str(value)):,} characters)"


def shown_list(value: Any, limit: int = 40) -> str:
    """A value as typed (a list joined with commas), cut to about ``limit`` characters like ``shown``."""
    text = ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


def ascii_float(text: str) -> float:
    """A decimal number in ASCII (``1``, ``2.5``, ``1e-3``); ValueError for anything else, including
    ``'١'``, ``'1_0'``, ``'nan'`` and ``'inf'``, which Python's ``float()`` reads."""
    stripped = str(text).strip()
    if not _ASCII_NUMBER.fullmatch(stripped):
        raise ValueError(f"not a decimal number: {text!r}")
    return float(stripped)


SWITCH_ON, SWITCH_OFF = ("1", "true", "yes"), ("", "0", "false", "no")


def env_switch(name: str) -> bool:
    """An environment switch (``KVBENCH_ALLOW_UNTESTED_TRANSFORMERS``): 1/true/yes on, 0/false/no or empty (or
    unset) off, any case; anything else is an InputError, since ``=garbage`` used to count as on."""
    raw = os.environ.get(name, "")
    word = raw.strip().lower()
    if word in SWITCH_ON or word in SWITCH_OFF:
        return word in SWITCH_ON
    raise InputError(f"environment variable {name}={shown(raw)} is not a switch value; use 1, true or yes "
                     f"(on), or 0, false, no or empty (off)")


SHARD_OPTION = "--kvbench-shard"  # read here: the grid checks it at configure, the plugin cuts items with it


def parse_shard(spec: str) -> tuple[int, int]:
    """``--kvbench-shard "2/3"`` -> ``(2, 3)``: 1-based part K of N (ASCII digits, N <= MAX_SHARDS);
    ValueError (one line) otherwise."""
    match = re.fullmatch(r"\s*([0-9]{1,6})\s*/\s*([0-9]{1,6})\s*", str(spec))
    if match:
        k, n = int(match.group(1)), int(match.group(2))
        if 1 <= n <= MAX_SHARDS and 1 <= k <= n:
            return k, n
    raise ValueError(f"{SHARD_OPTION} expects K/N with 1 <= K <= N <= {MAX_SHARDS:,} in ASCII digits (e.g. 2/3), "
                     f"got {shown(spec)}")
