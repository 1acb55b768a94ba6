"""full: the uncompressed reference row. Keeps every prompt token; the generation path is plain
greedy decoding with a DynamicCache, token-for-token what `model.generate` produces."""

from __future__ import annotations

from dataclasses import dataclass

from .base import Method


@dataclass
class Full(Method):
    name = "full"
    compresses = False
