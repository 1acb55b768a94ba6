"""The Hugging Face hub as a model source: offline or not, cached or not, reachable or not.

Named models prefer the hub's float weights; whether they can be had is decided from the local
cache and one short connection attempt, never by downloading anything.
"""

from __future__ import annotations

import functools
import os
import socket
from urllib.parse import urlparse

DEFAULT_ENDPOINT = "https://huggingface.co"
CONNECT_TIMEOUT_S = 3.0


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0").strip().lower() in ("1", "true", "yes", "on")


def cached_file(repo_id: str, filename: str) -> str | None:
    """The cached copy of one file of a hub repo, or None (nothing is fetched)."""
    # lazy for startup time: huggingface_hub, only when a hub id is resolved
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, filename)
    return found if isinstance(found, str) else None


def model_cached(repo_id: str) -> bool:
    """The repo's config and weights are in the local cache: ``from_pretrained`` works offline."""
    return cached_file(repo_id, "config.json") is not None and cached_file(repo_id, "model.safetensors") is not None


def hub_reachable() -> bool:
    """Not offline, and the hub's host accepts a connection within a few seconds (tried once per process)."""
    return not hub_offline() and _connects(os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)


@functools.lru_cache(maxsize=None)
def _connects(endpoint: str) -> bool:
    url = urlparse(endpoint)
    try:
        with socket.create_connection((url.hostname or "", url.port or 443), timeout=CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False
