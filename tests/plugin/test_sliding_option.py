"""--kvbench-sliding keep|compress (ini key kvbench_sliding, grid-file key `sliding`): checked at configure (one line,
exit 4), part of a compressing item's identity (id, key, record) so that results with and without it never pair,
refused at startup for methods that cannot select within a window, and reported in the records and RESULTS.md
(the window layers' share of the KV bytes)."""

from __future__ import annotations

import json
import shutil

import pytest

from helpers import run_bench
from bad_input_helpers import assert_one_line_usage_error
from kvmethods.testing import family_model
from pytest_kvbench.model_sources.embedded import DEFAULT_MODEL_DIR
from pytest_kvbench.record_key import ItemKey

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.fixture(scope="module")
def gemma2(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma2")
    vocab = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())["vocab_size"]  # the embedded tokenizer's
    family_model("gemma2", vocab_size=vocab).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(DEFAULT_MODEL_DIR / name, folder / name)
    return folder


@pytest.fixture
def workdir(pytester, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return pytester


@pytest.mark.parametrize("value", ["squeeze", "Compress", "keep,compress"])
def test_a_bad_value_is_one_line_at_startup(workdir, value):
    line = assert_one_line_usage_error(workdir, f"--kvbench-sliding={value}")
    assert "--kvbench-sliding: unknown value" in line and "valid: keep, compress" in line


def test_a_bad_ini_key_or_grid_file_key_is_one_line(workdir):
    workdir.makeini("[pytest]\nkvbench_sliding = squeeze\n")
    assert "ini key kvbench_sliding: unknown value" in assert_one_line_usage_error(workdir)
    (workdir.path / "grid.toml").write_text('sliding = "window"\n')
    line = assert_one_line_usage_error(workdir, "--kvbench-config", "grid.toml")
    assert "grid file grid.toml: sliding: unknown value" in line


def test_a_method_that_cannot_select_within_a_window_is_refused_at_startup(workdir, gemma2):
    line = assert_one_line_usage_error(workdir, "--kvbench-model", str(gemma2), "--kvbench-methods", "full,adakv",
                                       "--kvbench-sliding", "compress")
    assert "family 'gemma2' cannot be compressed by adakv: sliding-window layers compressed" in line
    result = workdir.runpytest_inprocess("-p", "no:cacheprovider", "--kvbench-model", str(gemma2),
                                         "--kvbench-methods", "full,adakv", "--kvbench-context-lengths", "400")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stderr.str()  # kept windows: it runs


def test_the_key_names_compressed_sliding_layers_and_parses_back():
    key = ItemKey.of("m", "snapkv", "64", "niah_single_1", 400, 0, "query_agnostic", "compress")
    assert key.text == "m|snapkv|64|niah_single_1@400|seed0|protocol=query_agnostic|sliding=compress"
    assert ItemKey.parse(key.text) == key
    plain = ItemKey.of("m", "snapkv", "64", "niah_single_1", 400, 0)
    assert plain.text == "m|snapkv|64|niah_single_1@400|seed0" and ItemKey.parse(plain.text).sliding == "keep"
    assert key.row == "snapkv (sliding compress)" and plain.row == "snapkv"


def _records(directory) -> dict[str, dict]:
    path = next((directory / "results" / "runs").glob("*/records.jsonl"))
    return {record["key"]: record for record in map(json.loads, path.read_text().splitlines())}


def test_a_run_with_compressed_sliding_layers_records_it_and_keeps_fewer_window_bytes(tmp_path, gemma2):
    """Two runs of the tiny gemma2 (window 12): the compressing items' keys, ids and records carry
    sliding=compress (the reference's do not: it compresses nothing), their window layers hold fewer bytes than
    with kept windows, and RESULTS.md shows the window share in its own column, on a marked row."""
    grid = ["--kvbench-model", str(gemma2), "--kvbench-methods", "full,snapkv", "--kvbench-budgets", "4",
            "--kvbench-tasks", "niah_single_1", "--kvbench-context-lengths", "400", "--kvbench-samples", "1"]
    windows = {}
    for policy in ("keep", "compress"):
        proc = run_bench(tmp_path / policy, *grid, "--kvbench-sliding", policy)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        records = _records(tmp_path / policy)
        snapkv = next(r for key, r in records.items() if "|snapkv|" in key)
        full = next(r for key, r in records.items() if "|full|" in key)
        assert snapkv["key"].endswith("|sliding=compress") == (policy == "compress")
        assert (snapkv.get("sliding") == "compress") == (policy == "compress")
        assert ("sliding_compress" in snapkv["item_id"]) == (policy == "compress")
        assert "sliding" not in full["key"] and "sliding" not in full
        sample = snapkv["samples"][0]
        windows[policy] = sample["kv_bytes_window"]
        assert 0 < sample["kv_bytes_window"] < sample["kv_bytes_after"]
        results = next((tmp_path / policy / "results" / "runs").glob("*/RESULTS.md")).read_text()
        assert "Window MiB" in results
        assert ("| snapkv (sliding compress) " in results) == (policy == "compress")
    per_token = 2 * 2 * 16 * 4  # K and V, 2 KV heads of 16, float32
    assert windows == {"keep": 11 * per_token, "compress": 4 * per_token}
