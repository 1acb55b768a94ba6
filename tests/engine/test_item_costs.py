"""What an item cost: the model's size on disk (weights only, hub snapshots followed), its KV-cache and latency
figures (engine/hardware/costs.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_kvbench.engine.hardware.costs import kv_cache_figures, latency_figures, model_size_on_disk

# ---------------------------------------------------------------------------- model size


def _write(path: Path, nbytes: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * nbytes)
    return path


def test_model_size_counts_safetensors_only_when_present(tmp_path):
    _write(tmp_path / "model-00001-of-00002.safetensors", 1000)
    _write(tmp_path / "model-00002-of-00002.safetensors", 500)
    _write(tmp_path / "pytorch_model.bin", 1500)        # same weights in the old format
    _write(tmp_path / "original" / "consolidated.pth", 1500)  # a copy transformers never reads
    _write(tmp_path / "config.json", 10)
    assert model_size_on_disk(tmp_path) == 1500


def test_model_size_counts_bin_weights_but_not_training_args(tmp_path):
    _write(tmp_path / "pytorch_model.bin", 700)
    _write(tmp_path / "training_args.bin", 50)
    assert model_size_on_disk(str(tmp_path)) == 700


def test_model_size_of_a_single_file(tmp_path):
    assert model_size_on_disk(_write(tmp_path / "model.safetensors", 321)) == 321


def test_model_size_of_a_cached_hub_repo_follows_snapshot_symlinks(tmp_path, monkeypatch):
    import huggingface_hub.constants

    repo = tmp_path / "models--org--tiny"
    _write(repo / "blobs" / "abc123", 4096)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("deadbeef")
    snapshot = repo / "snapshots" / "deadbeef"
    snapshot.mkdir(parents=True)
    os.symlink("../../blobs/abc123", snapshot / "model.safetensors")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert model_size_on_disk(snapshot) == 4096
    assert model_size_on_disk("org/tiny") == 4096
    assert model_size_on_disk("org/not-downloaded") is None


# ---------------------------------------------------------------------------- per-item figures


def test_kv_cache_figures_weight_the_ratio_by_prompt_length():
    figures = kv_cache_figures([4000, 1000], [1000, 1000])
    assert figures == {"kv_bytes_before": 2500, "kv_bytes_after": 1000, "compression_ratio": 2.5}


def test_kv_cache_figures_without_compression_and_without_samples():
    assert kv_cache_figures([800], [800])["compression_ratio"] == 1.0
    assert kv_cache_figures([], []) == {"kv_bytes_before": None, "kv_bytes_after": None, "compression_ratio": None}
    with pytest.raises(ValueError):
        kv_cache_figures([1, 2], [1])


def test_latency_figures_decode_rate_is_a_throughput_not_a_mean_of_rates():
    figures = latency_figures(prefill_s=[0.2, 0.4], decode_s=[1.0, 3.0], decode_tokens=[10, 90], total_s=5.0)
    # mean of per-sample rates would be (10 + 30) / 2 = 20; the throughput is 100 / 4 = 25.
    assert figures == {"prefill_ms": 300.0, "decode_tokens_per_s": 25.0, "total_s": 5.0}


def test_latency_figures_without_decode_time():
    figures = latency_figures(prefill_s=[0.1], decode_s=[0.0], decode_tokens=[0])
    assert figures["decode_tokens_per_s"] is None
    assert figures["total_s"] is None
