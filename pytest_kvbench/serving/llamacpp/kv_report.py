"""The KV cache llama.cpp allocated, read from its log, and its bytes for an item's context.

At start llama.cpp prints the model's geometry (``print_info: n_head_kv = 3``, ``n_embd_head_k``, ``n_swa``) and each
cache it allocates (``llama_kv_cache: size = 6.38 MiB (4096 cells, 3 layers, 1/1 seqs), K (q8_0): ...``; a model with
sliding-window layers gets a full cache and a window cache). The bytes of a cached token in one layer follow from
the cache types' blocks (kvmethods/core/engine_caches.py: q8_0 34 bytes per 32 values); this module checks that
figure against the engine's own size (its MiB to two decimals) and gives the bytes an item's context holds.
"""

from __future__ import annotations

import re

from kvmethods.core.engine_caches import bytes_per_value
from pytest_kvbench.serving.backend import CacheReport

MiB = 2**20
_GEOMETRY = re.compile(r"print_info: (n_layer|n_head_kv|n_embd_head_k|n_embd_head_v|n_swa)\s+=\s+(\d+)\s*$")
_KIND = re.compile(r"creating\s+(non-SWA|SWA) KV cache")
_CACHE = re.compile(r"llama_kv_cache: size =\s*([\d.]+) MiB \(\s*(\d+) cells,\s*(\d+) layers")
# the engine prints MiB to two decimals: its figure and the blocks' agree within a rounding step and this share
TOLERANCE = 0.01


def cache_report(log: str, cache_type_k: str, cache_type_v: str) -> CacheReport | None:
    """The report of an engine's log; None when the log lacks the model's geometry (another llama.cpp build)."""
    geometry: dict[str, int] = {}
    caches: list[tuple[bool, int, int, float]] = []  # (window cache, cells, layers, MiB)
    window_cache = False
    for line in log.splitlines():
        if (found := _GEOMETRY.search(line)) and found.group(1) not in geometry:
            geometry[found.group(1)] = int(found.group(2))
        elif found := _KIND.search(line):
            window_cache = found.group(1) == "SWA"
        elif found := _CACHE.search(line):
            caches.append((window_cache, int(found.group(2)), int(found.group(3)), float(found.group(1))))
    if not {"n_layer", "n_head_kv", "n_embd_head_k", "n_embd_head_v"} <= set(geometry):
        return None
    per_token_layer = float(geometry["n_head_kv"] * (geometry["n_embd_head_k"] * bytes_per_value(cache_type_k)
                                                     + geometry["n_embd_head_v"] * bytes_per_value(cache_type_v)))
    window_layers = sum(layers for window, _, layers, _ in caches if window)
    layers = sum(layers for window, _, layers, _ in caches if not window) if caches else geometry["n_layer"]
    reported = round(sum(mib for *_, mib in caches) * MiB) if caches else None
    allocated = round(sum(cells * layers * per_token_layer for _, cells, layers, _ in caches)) if caches else None
    return CacheReport(per_token_layer, layers, window_layers, geometry.get("n_swa") if window_layers else None,
                       reported, allocated)


def agrees(report: CacheReport) -> bool | None:
    """Whether the blocks' figure matches the engine's own (None: the engine printed none)."""
    if report.reported_bytes is None or report.allocated_bytes is None:
        return None
    return abs(report.reported_bytes - report.allocated_bytes) <= max(TOLERANCE * report.allocated_bytes,
                                                                     0.01 * MiB * 2)
