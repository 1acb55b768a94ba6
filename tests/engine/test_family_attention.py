"""The attention implementation each family loads with: sdpa where its class runs it, eager where it does not
(gemma2 and gpt-oss in transformers 5.24: forcing sdpa failed at load), and the record says which ran."""

from __future__ import annotations

import shutil

import pytest

from kvmethods.testing import family_model
from kvmethods.adapters.transformers_compat import supported_attention
from pytest_kvbench.engine.models import ModelCache
from pytest_kvbench.model_sources.embedded import DEFAULT_MODEL_DIR


@pytest.mark.parametrize("family", ["llama", "gemma2", "gpt_oss"])
def test_the_family_loads_with_an_attention_its_class_runs(tmp_path, family):
    model = family_model(family)
    model.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(DEFAULT_MODEL_DIR / name, tmp_path / name)
    expected = supported_attention(model.config, "sdpa")
    assert (expected == "sdpa") == bool(getattr(type(model), "_supports_sdpa", True))
    loaded, _ = ModelCache().get(str(tmp_path), "float32", "sdpa")
    assert loaded.attn_implementation == expected == loaded.model.config._attn_implementation
    assert loaded.info()["attn_implementation"] == expected
    assert supported_attention(model.config, "eager") == "eager"  # asked for, never changed
