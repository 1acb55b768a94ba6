"""The bad inputs that still got through startup (issue 50's probes), each one line at configure, exit 4.

A FIFO or a link to /dev/zero given as a model file hung startup; a model folder of a family the benchmark
cannot run, or whose weights are cut short, or whose shard index leaves the folder, failed at load in every
item; a GGUF header whose shapes do not divide passed startup; a deepseek_v3 config with fewer KV heads than
query heads failed every compressing item in the shared prefill; a dangling link as the conversion cache failed
each item with "File exists"; baselines with Infinity, no samples, repeated sample ids or a negative count were
read; tolerances that can never fail or that nothing uses were accepted; --kvbench-sliding compress renamed a
model's items for no effect; a baseline saved under a missing folder made that folder (at ``/`` for an absolute
path). Each is refused here before anything is written (assert_one_line_usage_error checks that too).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import struct

import pytest

from gguf_helpers import write_tiny_gguf
from bad_input_helpers import assert_one_line_usage_error
from pytest_kvbench.model_sources import gguf_cache
from pytest_kvbench.model_sources.embedded import DEFAULT_MODEL_DIR

BASELINE = DEFAULT_MODEL_DIR.parent.parent / "results" / "baseline-smoke.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.fixture
def workdir(pytester, monkeypatch, tmp_path_factory):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path_factory.mktemp("cache") / "gguf"))
    return pytester


def model_folder(where, **config_changes):
    """A copy of the embedded model's folder, its config.json changed as given."""
    shutil.copytree(DEFAULT_MODEL_DIR, where)
    config = json.loads((where / "config.json").read_text())
    (where / "config.json").write_text(json.dumps(config | config_changes))
    return where


def test_a_fifo_or_a_device_as_the_model_file_is_refused_not_waited_on(workdir):
    os.mkfifo(workdir.path / "pipe.gguf")
    os.symlink("/dev/zero", workdir.path / "zero.gguf")
    message = assert_one_line_usage_error(workdir, "--kvbench-model", "pipe.gguf")
    assert "model file pipe.gguf: is a FIFO (named pipe), not a regular file" in message
    message = assert_one_line_usage_error(workdir, "--kvbench-model", "zero.gguf")
    assert "model file zero.gguf: is a device, not a regular file" in message


def test_a_model_folder_of_a_state_space_model_is_refused(workdir):
    folder = model_folder(workdir.path / "mamba", model_type="mamba", architectures=["MambaForCausalLM"])
    message = assert_one_line_usage_error(workdir, "--kvbench-model", str(folder), "--kvbench-methods", "full")
    assert "model_type 'mamba' cannot be benchmarked: it is a state-space model" in message


def test_a_truncated_model_safetensors_is_refused(workdir):
    folder = model_folder(workdir.path / "cut")
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    os.truncate(weights, size // 2)
    message = assert_one_line_usage_error(workdir, "--kvbench-model", str(folder), "--kvbench-methods", "full")
    assert f"model.safetensors is truncated ({size // 2} bytes, its tensors need {size})" in message
    assert "download or copy it again" in message


def _sharded(folder, shard: str):
    """The embedded model's folder with its weights as one shard named ``shard`` in an index."""
    weights = folder / "model.safetensors"
    with open(weights, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        names = [name for name in json.loads(handle.read(length)) if name != "__metadata__"]
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(names, shard)}))
    return weights


def test_a_truncated_shard_is_refused(workdir):
    folder = model_folder(workdir.path / "sharded")
    weights = _sharded(folder, "model-00001-of-00001.safetensors")
    shard = weights.rename(folder / "model-00001-of-00001.safetensors")
    os.truncate(shard, shard.stat().st_size - 1)
    message = assert_one_line_usage_error(workdir, "--kvbench-model", str(folder), "--kvbench-methods", "full")
    assert "model-00001-of-00001.safetensors is truncated" in message


def test_a_shard_index_pointing_outside_the_folder_is_refused_for_that_reason(workdir):
    folder = model_folder(workdir.path / "sharded")
    _sharded(folder, "../outside.safetensors").rename(workdir.path / "outside.safetensors")
    message = assert_one_line_usage_error(workdir, "--kvbench-model", str(folder), "--kvbench-methods", "full")
    assert "names a shard outside the model folder (../outside.safetensors)" in message


@pytest.mark.parametrize("heads, kv_heads, problem", [
    (3, 1, "embedding_length 64, which is not a multiple of its 3 attention heads"),
    (4, 3, "4 attention heads and 3 KV heads, which do not divide them"),
])
def test_a_gguf_header_whose_head_shapes_do_not_divide_is_refused(workdir, heads, kv_heads, problem):
    odd = write_tiny_gguf(workdir.path / "odd.gguf", heads=heads, kv_heads=kv_heads)
    message = assert_one_line_usage_error(workdir, "--kvbench-model", str(odd), "--kvbench-methods", "full")
    assert problem in message


def test_a_deepseek_v3_config_with_fewer_kv_heads_is_refused_for_compressing_methods(workdir):
    from kvmethods.testing import family_model  # lazy: torch, for this test only

    folder = workdir.path / "deepseek"
    vocab = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text())["vocab_size"]
    family_model("deepseek_v3", vocab_size=vocab, num_key_value_heads=2).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(DEFAULT_MODEL_DIR / name, folder / name)
    message = assert_one_line_usage_error(workdir, "--kvbench-model", str(folder), "--kvbench-methods", "full,snapkv")
    assert "num_key_value_heads 2 and num_attention_heads 4 cannot be compressed by snapkv" in message
    result = workdir.runpytest_inprocess("-p", "no:cacheprovider", "--kvbench-model", str(folder),
                                         "--kvbench-methods", "full", "--kvbench-context-lengths", "256")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stderr.str()  # full alone runs it


def test_a_dangling_link_as_the_conversion_cache_is_refused(workdir, monkeypatch, tmp_path):
    tiny = write_tiny_gguf(workdir.path / "tiny.gguf")
    os.symlink(tmp_path / "gone", tmp_path / "cache-link")  # outside the work folder, whose files are listed
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "cache-link"))
    message = assert_one_line_usage_error(workdir, "--kvbench-model", str(tiny))
    assert f"cache-link: is a link to {tmp_path / 'gone'}, which does not exist" in message
    assert not (tmp_path / "gone").exists()


def _first_entry(sample_change=None, **entry_change):
    baseline = copy.deepcopy(json.loads(BASELINE.read_text()))
    entry = next(iter(baseline["entries"].values()))
    entry.update(entry_change)
    if sample_change:
        sample_change(entry["samples"])
    return baseline


@pytest.mark.parametrize("baseline, problem", [
    (_first_entry(lambda samples: samples[0].update(kl=float("inf"))), "has kl inf; it must be a finite number"),
    (_first_entry(samples=[]), "has no samples"),
    (_first_entry(lambda samples: samples[1].update(id=samples[0]["id"])), "appears twice (samples pair by id)"),
    (_first_entry(n_samples=-1), "'n_samples' must be a positive integer, got -1"),
    (_first_entry(lambda samples: samples[0].update(prompt_tokens="882")), "has prompt_tokens '882'; it must be a whole"),
    (_first_entry(lambda samples: samples[0].update(prompt_tokens=-1)), "has prompt_tokens -1; it must be a whole"),
], ids=["kl-infinity", "no-samples", "repeated-id", "negative-count", "prompt-tokens-text", "prompt-tokens-negative"])
def test_a_baseline_that_cannot_gate_is_refused(workdir, baseline, problem):
    (workdir.path / "baseline.json").write_text(json.dumps(baseline))  # json writes Infinity for inf
    assert problem in assert_one_line_usage_error(workdir, "--kvbench-compare", "baseline.json")


def test_a_tolerance_that_can_never_fail_is_refused(workdir):
    message = assert_one_line_usage_error(workdir, "--kvbench-compare", str(BASELINE),
                                          "--kvbench-compare-fail", "agreement:1.5")
    assert "agreement lies in 0-1, so a change of 1.5 can never fail" in message
    message = assert_one_line_usage_error(workdir, "--kvbench-compare", str(BASELINE),
                                          "--kvbench-compare-fail", "score:101")
    assert "score lies in 0-100" in message


def test_tolerances_without_a_baseline_are_refused(workdir):
    message = assert_one_line_usage_error(workdir, "--kvbench-compare-fail", "kl:0.5")
    assert "--kvbench-compare-fail kl:0.5 has no effect without --kvbench-compare BASELINE" in message


def test_sliding_compress_on_a_model_without_sliding_layers_is_refused(workdir):
    message = assert_one_line_usage_error(workdir, "--kvbench-sliding", "compress",
                                          "--kvbench-methods", "full,snapkv")
    assert "model default: --kvbench-sliding compress, but the model has no sliding-window layers" in message
    result = workdir.runpytest_inprocess("-p", "no:cacheprovider", "--kvbench-sliding", "compress",
                                         "--kvbench-methods", "full")  # nothing compresses: no item renamed
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stderr.str()


def test_a_baseline_saved_under_a_missing_folder_is_refused_and_no_folder_made(workdir):
    target = workdir.path / "nowhere" / "dir" / "b.json"
    message = assert_one_line_usage_error(workdir, "--kvbench-save", str(target))
    assert "does not exist; create it first" in message  # the path itself may be shortened in the line
    assert not (workdir.path / "nowhere").exists()
