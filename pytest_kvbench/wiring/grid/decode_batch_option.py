"""`--kvbench-decode-batch auto|N` (ini key kvbench_decode_batch): how many members decode in one batch.

Read and checked at configure, before any model loads: `auto` (sized from the free CUDA memory, or a CPU
default: engine/decode_batching.py) or a whole number from 1 to MAX_DECODE_BATCH in ASCII digits; `1` is
sequential decoding, member by member. Anything else is one line and exit 4. Pure Python: the engine, which
imports torch, gets the checked value through RunnerSettings.
"""

from __future__ import annotations

import pytest

from pytest_kvbench.input_values import MAX_DECODE_BATCH, InputError, ascii_int, shown

OPTION = "--kvbench-decode-batch"
INI = "kvbench_decode_batch"
AUTO = "auto"
DEFAULT = AUTO
HELP = (f"members (of one sample or several) decoding in one batched forward per step: "
        f"'auto' (free CUDA memory, or up to 128 on CPU) "
        f"or 1..{MAX_DECODE_BATCH} (1: one member after another); default {DEFAULT}")


def add_option(parser: pytest.Parser) -> None:
    parser.getgroup("kvbench").addoption(OPTION, dest=INI, default=None, help=HELP)
    parser.addini(INI, HELP, default=None)


def decode_batch(config: pytest.Config) -> int | str:
    """The checked setting: "auto" or an int in [1, MAX_DECODE_BATCH]; InputError (one line) otherwise."""
    given = config.getoption(INI)
    where = OPTION
    if given is None:
        given, where = config.getini(INI), f"ini key {INI}"
        if given is None:
            given = DEFAULT
    text = given.strip() if isinstance(given, str) else given
    if text == AUTO:
        return AUTO
    try:
        return ascii_int(text, where, minimum=1, maximum=MAX_DECODE_BATCH)
    except InputError:
        raise InputError(f"{where} must be 'auto' or a whole number from 1 to {MAX_DECODE_BATCH:,}, "
                         f"got {shown(given)}") from None
