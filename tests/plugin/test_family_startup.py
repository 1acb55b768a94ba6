"""A local model folder is checked against the grid's methods and its own weights at configure: a family a method
cannot compress, or a config.json that contradicts the safetensors beside it, is one line (exit 4), before any
weights load; a family the methods can compress configures (no item fails later for it)."""

from __future__ import annotations

import json
import shutil

import pytest

from bad_input_helpers import assert_one_line_usage_error
from kvmethods.core.catalog import BUILTINS
from kvmethods.core.layout import refusal
from kvmethods.core.family_table import layout_of
from kvmethods.testing import FAMILIES, family_config, family_model
from pytest_kvbench.cases import GridError
from pytest_kvbench.model_sources.embedded import DEFAULT_MODEL_DIR
from pytest_kvbench.wiring.grid import family_check

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {}
    for family in ("gpt_oss", "deepseek_v3", "gemma2", "llama"):
        folder = tmp_path_factory.mktemp(family)
        family_model(family).save_pretrained(folder)
        for name in TOKENIZER_FILES:
            shutil.copy(DEFAULT_MODEL_DIR / name, folder / name)
        made[family] = folder
    return made


@pytest.fixture
def workdir(pytester, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return pytester


@pytest.mark.parametrize("family, method, reason", [
    ("gpt_oss", "kvzip", "sliding-window layers"),
    ("deepseek_v3", "kivi", "multi-head latent attention (MLA)"),
    ("gpt_oss", "expected_attention", "it needs pre-RoPE queries"),
])
def test_a_family_a_method_cannot_compress_is_one_line_at_startup(workdir, folders, family, method, reason):
    message = assert_one_line_usage_error(workdir, "--kvbench-model", str(folders[family]),
                                          "--kvbench-methods", f"full,{method}")
    assert f"family {family!r} cannot be compressed by {method}: {reason}" in message


def test_every_method_a_family_refuses_is_named_in_the_one_line(workdir, folders):
    """Three refused methods in the grid are three (method, reason) pairs in one line, not the first one only:
    the user fixes the grid once."""
    message = assert_one_line_usage_error(workdir, "--kvbench-model", str(folders["deepseek_v3"]),
                                          "--kvbench-methods", "full,adakv,snapkv,kivi,kvzip")
    layout = layout_of(family_config("deepseek_v3"))
    reasons = {name: refusal(layout, BUILTINS[name].capabilities) for name in ("adakv", "kivi", "kvzip")}
    assert all(reasons.values()) and refusal(layout, BUILTINS["snapkv"].capabilities) is None
    assert "family 'deepseek_v3' cannot be compressed by adakv: " in message
    for name, reason in reasons.items():
        assert f"{name}: {reason}" in message
    assert "snapkv" not in message


def test_a_family_the_methods_compress_configures(workdir, folders):
    result = workdir.runpytest_inprocess("-p", "no:cacheprovider", "--kvbench-model", str(folders["gemma2"]),
                                         "--kvbench-methods", "full,snapkv,h2o,kivi", "--kvbench-context-lengths", "400")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stderr.str()


@pytest.mark.parametrize("change, words", [({"vocab_size": 96}, "vocab_size 96"),
                                           ({"num_hidden_layers": 3}, "the config has 3 layers")])
def test_a_config_that_contradicts_its_weights_is_one_line(workdir, folders, tmp_path, change, words):
    folder = tmp_path / "edited"
    shutil.copytree(folders["llama"], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | change))
    message = assert_one_line_usage_error(workdir, "--kvbench-model", str(folder))
    assert "config.json contradicts its weights" in message and words in message


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_and_builtin_method_is_supported_or_refused_at_startup_in_one_line(family):
    """The walk of the family x method table at configure: a refusal is a GridError of one line naming the family,
    the method and the reason (the same rule the runtime asks, tests/kvmethods/test_families.py)."""
    config = family_config(family)
    layout = layout_of(config)
    for name, entry in sorted(BUILTINS.items()):
        reason = refusal(layout, entry.capabilities)
        if reason is None:
            family_check.check_methods("tiny", config, {name: entry.capabilities})
            continue
        with pytest.raises(GridError) as refused:
            family_check.check_methods("tiny", config, {name: entry.capabilities})
        message = str(refused.value)
        assert "\n" not in message and f"family {family!r} cannot be compressed by {name}: {reason}" in message
