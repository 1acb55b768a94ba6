"""Figures a record reports from raw counts: model size on disk, KV-cache sizes, latency."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from pytest_kvbench.results.record import mean_of_present


def _weight_files(directory: Path) -> list[Path]:
    """The files ``from_pretrained`` would load weights from: safetensors, else PyTorch ``.bin``.

    Only the top level: hub repos often ship a second copy (``original/consolidated.pth``) that
    transformers never reads, and counting it would double the size.
    """
    files = sorted(p for p in directory.iterdir() if p.is_file())
    safetensors = [p for p in files if p.name.endswith(".safetensors")]
    if safetensors:
        return safetensors
    return [p for p in files if p.name.endswith(".bin") and p.name != "training_args.bin"]


def _hub_snapshot(repo_id: str) -> Path | None:
    """The local HF cache snapshot of ``repo_id``, without touching the network."""
    try:
        # lazy for startup time: huggingface_hub, only for a hub model's size
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached / not a repo id: size unknown, never an error
        return None


def model_size_on_disk(path_or_dir: str | os.PathLike) -> int | None:
    """Bytes of the model's weight files, for the per-model table (load time vs. size).

    Accepts a weight file, a local model directory, or a hub repo id already in the local HF
    cache (snapshot files are symlinks into ``blobs/``; their targets are measured). None when
    the model cannot be found locally: an unknown size is not zero.
    """
    path = Path(path_or_dir)
    if not path.exists():
        path = _hub_snapshot(str(path_or_dir))
        if path is None:
            return None
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in _weight_files(path))


def kv_cache_figures(kv_bytes_before: Iterable[int], kv_bytes_after: Iterable[int]) -> dict:
    """Per-item KV-cache figures from per-sample cache sizes (``generate()``'s out.kv_bytes_*).

    ``kv_bytes_before`` / ``kv_bytes_after`` are per-sample means (prompts differ in length);
    ``compression_ratio`` is total-before / total-after, so it is weighted by prompt length and
    reads "the cache is N times smaller" (4.0 for a 4x smaller cache; 1.0 for full cache).
    """
    before = [int(b) for b in kv_bytes_before]
    after = [int(a) for a in kv_bytes_after]
    if len(before) != len(after):
        raise ValueError(f"{len(before)} kv_bytes_before values but {len(after)} kv_bytes_after values")
    mean_before, mean_after = mean_of_present(before), mean_of_present(after)
    ratio = round(sum(before) / sum(after), 4) if before and sum(after) > 0 else None
    return {
        "kv_bytes_before": round(mean_before) if mean_before is not None else None,
        "kv_bytes_after": round(mean_after) if mean_after is not None else None,
        "compression_ratio": ratio,
    }


def latency_figures(prefill_s: Iterable[float], decode_s: Iterable[float],
                    decode_tokens: Iterable[int], total_s: float | None = None) -> dict:
    """Per-item latency from per-sample timings (``generate()``'s out.prefill_s / out.decode_s).

    ``prefill_ms`` is the mean per sample. ``decode_tokens_per_s`` is total decode tokens over
    total decode time (a throughput, not a mean of per-sample rates, which short answers would
    dominate); pass the tokens produced *during* the decode phase, not the one prefill emitted.
    None when there was no decode time to divide by.
    """
    prefill = [float(s) for s in prefill_s]
    decode = [float(s) for s in decode_s]
    tokens = [int(t) for t in decode_tokens]
    if len(decode) != len(tokens):
        raise ValueError(f"{len(decode)} decode times but {len(tokens)} decode token counts")
    mean_prefill = mean_of_present(prefill)
    decode_time = sum(decode)
    return {
        "prefill_ms": round(mean_prefill * 1000.0, 3) if mean_prefill is not None else None,
        "decode_tokens_per_s": round(sum(tokens) / decode_time, 3) if decode_time > 0 else None,
        "total_s": round(total_s, 4) if total_s is not None else None,
    }
