"""A serving engine's own KV-cache types, named in the method-spec grammar: ``llamacpp:q8_0``.

An engine spec is not a transformers method: llama.cpp stores its cache in blocks of its own (ggml's types) and
the benchmark drives the engine through its server (pytest_kvbench/serving/). It is named here, beside the other
spec vocabulary, so that the grid, the item ids and the registry read it without torch or the engine installed:

    llamacpp:f16                 keys and values both f16 (the engine's reference)
    llamacpp:q8_0                keys and values both q8_0
    llamacpp:k=q8_0:v=q4_0       keys q8_0, values q4_0 (also llamacpp:q8_0:v=q4_0)

A cache type's size is ggml's block: `q8_0` holds 32 values in 34 bytes (32 int8 + an f16 scale), `q4_0` 32 in
18 (16 bytes of nibbles + an f16 scale), `f16` 2 bytes each. The byte fraction of an engine row is its bytes over
f16 keys and values: what a byte budget `mF` compares to (q8_0 0.53, q4_0 0.28).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .errors import MethodError

ENGINE = "llamacpp"
ENGINE_PREFIX = ENGINE + ":"
KEYS, VALUES = "k", "v"
REFERENCE_TYPE = "f16"  # the engine's own reference cache: what its quantized types are compared with
# ggml's KV-cache types llama.cpp accepts (common/arg.cpp's kv_cache_types): bytes per block, values per block
BLOCKS: dict[str, tuple[int, int]] = {
    "f32": (4, 1), "f16": (2, 1), "bf16": (2, 1),
    "q8_0": (34, 32), "q4_0": (18, 32), "q4_1": (20, 32), "q5_0": (22, 32), "q5_1": (24, 32), "iq4_nl": (18, 32),
}


def is_engine_name(name: str) -> bool:
    """Whether a spec's name is an engine's (``llamacpp`` or ``llamacpp:<type>``)."""
    name = name.strip()
    return name == ENGINE or name.startswith(ENGINE_PREFIX)


def bytes_per_value(cache_type: str) -> Fraction:
    """Bytes one stored element takes, blocks included: q8_0 34/32, q4_0 18/32, f16 2."""
    size, values = BLOCKS[cache_type]
    return Fraction(size, values)


def block_values(cache_type: str) -> int:
    """Values per block: a head dimension must be a multiple of it."""
    return BLOCKS[cache_type][1]


@dataclass(frozen=True)
class EngineCaches:
    """The cache types of one engine spec."""

    keys: str
    values: str

    @property
    def name(self) -> str:
        """The canonical name: ``llamacpp:q8_0`` when keys and values agree, else ``llamacpp`` with k and v."""
        return ENGINE_PREFIX + self.keys if self.keys == self.values else ENGINE

    @property
    def params(self) -> dict[str, str]:
        return {} if self.keys == self.values else {KEYS: self.keys, VALUES: self.values}

    @property
    def byte_fraction(self) -> float:
        """Bytes per cached token over those of f16 keys and values (the full cache's, in transformers' f16)."""
        reference = 2 * bytes_per_value(REFERENCE_TYPE)
        return float((bytes_per_value(self.keys) + bytes_per_value(self.values)) / reference)

    @property
    def is_reference(self) -> bool:
        return self.keys == self.values == REFERENCE_TYPE

    @property
    def quantized(self) -> bool:
        """Whether a type is block-quantized (llama.cpp needs flash attention for a quantized value cache)."""
        return block_values(self.keys) > 1 or block_values(self.values) > 1


def _cache_type(text: str, spec: str) -> str:
    cache_type = str(text).strip().lower()
    if cache_type not in BLOCKS:
        raise MethodError(f"{spec}: unknown llama.cpp cache type {str(text)!r}; valid: {', '.join(BLOCKS)}")
    return cache_type


def engine_caches(name: str, params: dict) -> EngineCaches:
    """The cache types an engine spec names (MethodError, one line, naming the valid types)."""
    spec = ":".join([name, *(f"{key}={value}" for key, value in params.items())])
    _, _, named = name.strip().partition(":")
    unknown = sorted(set(params) - {KEYS, VALUES})
    if unknown:
        raise MethodError(f"{spec}: unknown parameter {unknown[0]!r}; an engine spec takes {KEYS}= and {VALUES}= "
                          f"(cache types of keys and values)")
    if ":" in named:
        raise MethodError(f"{spec}: name one cache type after {ENGINE_PREFIX!r}, like {ENGINE_PREFIX}q8_0")
    base = _cache_type(named, spec) if named else None
    keys = _cache_type(params[KEYS], spec) if KEYS in params else base
    values = _cache_type(params[VALUES], spec) if VALUES in params else base
    if keys is None or values is None:
        raise MethodError(f"{spec}: name the cache type, like {ENGINE_PREFIX}q8_0 or {ENGINE}:{KEYS}=q8_0:{VALUES}=q4_0; "
                          f"valid: {', '.join(BLOCKS)}")
    return EngineCaches(keys, values)
