"""full: the uncompressed reference row. Keeps every prompt token; the generation path is plain
greedy decoding with a DynamicCache, token-for-token what `model.generate` produces."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Method
from .capabilities import Capability


@dataclass
class Full(Method):
    name = "full"
    paper = "the uncompressed cache (reference row)"
    capabilities = Capability(0)
    kvpress_name = "no_press"
    kvcache_factory_name = "FullKV"
