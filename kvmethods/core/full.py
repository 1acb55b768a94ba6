"""full: the uncompressed reference row. Keeps every prompt token; the generation path is plain
greedy decoding with a DynamicCache, token-for-token what `model.generate` produces."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Method, declared_capabilities


@dataclass
class Full(Method):
    name = "full"
    capabilities = declared_capabilities(name)  # declared once, in catalog.py
