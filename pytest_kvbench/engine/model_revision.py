"""Which commit of a hub model a run used, so that `kvbench env` can name it for reproduction.

A hub id alone is a moving target: the repository may be updated after the run. huggingface_hub's cache keeps
each download under snapshots/<commit sha>/, so the sha of the config.json that was loaded names the exact
revision, found without network access. A local directory (or the embedded default model) has none.
"""

from __future__ import annotations

import functools
from pathlib import Path


@functools.lru_cache(maxsize=None)
def hub_revision(source: str) -> str | None:
    """The commit sha of `source`'s cached config.json when `source` is a hub id; None for a local path."""
    if Path(source).exists():
        return None
    # lazy for startup time: huggingface_hub, only for hub models
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(source, "config.json")
    except ValueError:  # not a valid repository id
        return None
    if not isinstance(cached, str):
        return None
    snapshot = Path(cached).parent
    return snapshot.name if snapshot.parent.name == "snapshots" else None
