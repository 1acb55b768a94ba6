"""The families with layers of their own kinds run end to end through the plugin: qwen3_next (linear-attention
layers between softmax ones) and deepseek_v3 (multi-head latent attention), saved as folders with the embedded
tokenizer, with the full-cache reference and compressing methods in one run; the records carry the memory figures
of what their caches really hold (the linear state in full, kv_bytes_state)."""

from __future__ import annotations

import json
import shutil

import pytest

from helpers import run_bench
from kvmethods.testing import family_model
from pytest_kvbench.model_sources.embedded import DEFAULT_MODEL_DIR

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
METHODS = {"qwen3_next": "full,snapkv,kivi:group_size=16:residual=16", "deepseek_v3": "full,snapkv,h2o"}


def _records(directory) -> dict[str, dict]:
    path = next((directory / "results" / "runs").glob("*/records.jsonl"))
    return {record["key"]: record for record in map(json.loads, path.read_text().splitlines())}


@pytest.mark.parametrize("family", ["qwen3_next", "deepseek_v3"])
def test_the_family_runs_through_the_plugin_and_records_what_its_cache_holds(tmp_path, family):
    folder = tmp_path / family
    vocab = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())["vocab_size"]  # the embedded tokenizer's
    family_model(family, vocab_size=vocab).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(DEFAULT_MODEL_DIR / name, folder / name)
    proc = run_bench(tmp_path / "work", "--kvbench-model", str(folder), "--kvbench-methods", METHODS[family],
                     "--kvbench-budgets", "16", "--kvbench-tasks", "niah_single_1", "--kvbench-context-lengths", "400",
                     "--kvbench-samples", "2", "--kvbench-torch-threads", "1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = _records(tmp_path / "work")
    assert {key.split("|")[1].split("(")[0] for key in records} == {m.split(":")[0] for m in METHODS[family].split(",")}
    for key, record in records.items():
        for sample in record["samples"]:
            assert ("kv_bytes_state" in sample) == (family == "qwen3_next"), key
            if "|snapkv|" in key:
                state = sample.get("kv_bytes_state", 0)
                assert sample["kv_bytes_after"] - state < sample["kv_bytes_before"] - state, key
                # the mean over the layers holding tokens: qwen3_next's linear layer (0 tokens) is not in it
                assert sample["kept_tokens"] == 16 and 16 in sample["kept_tokens_per_layer"], key
