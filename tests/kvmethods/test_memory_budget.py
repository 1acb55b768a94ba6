"""Byte budgets ("m0.25") and compositions ("snapkv+kivi", "snapkv+think+kivi"): each method's operating point stays within
the budget, the record says how far from it, and bad specs are one-line usage errors at collection."""

import pytest
import torch

from kvmethods import Budget, MethodError, get_method
from kvmethods.runtime.generation import generate
from kvmethods.core.memory_budget import CacheGeometry, operating_point
from kvmethods.testing import tiny_model
from model_helpers import one_thread  # noqa: F401 (a module-scoped autouse fixture: applies here)
from helpers import GRID
from helpers import collected_ids

PROMPT = torch.randint(3, 256, (400,), generator=torch.Generator().manual_seed(7)).tolist()


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=3, qk_scale=4.0, hidden_size=128)  # head_dim 32


def test_byte_budgets_parse_print_and_sort_after_the_other_kinds():
    budget = Budget.parse("m0.25")
    assert (budget.kind, budget.value, budget.spec) == ("memory", 0.25, "m0.25")
    specs = ["m0.5", "r0.5", "m0.25", "128"]
    assert sorted(specs, key=lambda s: Budget.parse(s).sort_key) == ["128", "r0.5", "m0.25", "m0.5"]
    for bad in ("m0", "m1.5", "m-0.1", "mx"):
        with pytest.raises(MethodError, match="invalid budget"):
            Budget.parse(bad)


@pytest.mark.parametrize("spec, params", [
    ("snapkv", {}), ("streamingllm", {}), ("kivi", {"bits": 2}), ("kivi", {"bits": 4}),
    ("snapkv+kivi", {"bits": 2}), ("snapkv+kivi", {"bits": 4}), ("h2o+kivi", {"bits": 4, "residual": 64}),
    ("snapkv+think", {}), ("think+kivi", {"bits": 2}), ("snapkv+think+kivi", {"bits": 4}),
])
@pytest.mark.parametrize("protocol", ["question_in_window", "query_agnostic"])
@pytest.mark.parametrize("fraction", ["m0.25", "m0.5"])
def test_every_operating_point_stays_within_the_byte_budget(model, spec, params, protocol, fraction):
    out = generate(model, get_method(spec, **params), fraction, PROMPT, 340, 3, set(), protocol)
    assert out.kv_bytes_budget == int(Budget.parse(fraction).value * out.kv_bytes_before)
    assert 0 < out.kv_bytes_physical <= out.kv_bytes_budget


def test_compositions_keep_more_tokens_than_eviction_at_the_same_bytes(model):
    kept = {spec: generate(model, get_method(spec, **params), "m0.25", PROMPT, 340, 1, set(),
                           "question_in_window").kept_tokens_per_layer[0]
            for spec, params in [("snapkv", {}), ("snapkv+kivi", {"bits": 4}), ("snapkv+kivi", {"bits": 2}),
                                 ("kivi", {})]}
    assert kept["snapkv"] == 100  # a quarter of the prompt at full precision
    assert kept["snapkv"] < kept["snapkv+kivi"] <= kept["kivi"] == 400


def test_the_operating_point_is_the_most_tokens_that_fit():
    geometry = CacheGeometry(heads=2, head_dim=32, element_size=2)
    method = get_method("snapkv+kivi", bits=2, residual=32)
    n = operating_point(method, Budget.parse("m0.25"), 1000, geometry)
    allowed = 0.25 * geometry.full_bytes(1000)
    assert method.stored_bytes(n, 2, 32, 2) <= allowed
    assert all(method.stored_bytes(m, 2, 32, 2) > allowed for m in range(n + 1, 1001))
    assert operating_point(get_method("snapkv"), Budget.parse("m0.25"), 1000, geometry) == 250


def test_a_composition_is_one_method_with_prefixed_parameters():
    method = get_method("snapkv+kivi", bits=4, window=16, **{"kivi.group_size": 16})
    assert method.name == "snapkv+kivi"
    assert method.params() == {"snapkv.window": 16, "snapkv.kernel": 7, "snapkv.pooling": "avgpool",
                               "kivi.bits": 4, "kivi.group_size": 16, "kivi.residual": 32}


@pytest.mark.parametrize("spec, fragment", [
    ("kivi+kivi", "a composition takes at most one quantizer, got 2"),
    ("snapkv+think+think", "a composition takes at most one think, got 2"),
    ("think+kivi:recent=8", "think's 'recent' does not apply with kivi"),
    ("think:pruning_ratio=1", "'pruning_ratio' must be in [0, 1)"),
    ("snapkv+h2o", "a composition takes at most one eviction method, got 2"),
    ("full+kivi", "full evicts nothing"),
    ("adakv+kivi", "adakv stores a ragged cache"),
    ("snapkv+kivi:bitz=2", "unknown parameter 'bitz'"),
    ("snapkv+kivi:h2o.bits=2", "'h2o.bits' names no part"),
    ("snapkv+kivi:bits=3", "'bits' must be 2 or 4"),
    ("snapkv+kivi+h2o", "a composition takes at most one eviction method, got 2"),
    ("snapkv+think+kivi+h2o", "a composition is an eviction method, think and/or a quantizer"),
    ("kvzip:prefill_chunk=64", "kvzip: cannot prefill in chunks"),  # chunked prefill (test_chunked_prefill.py)
    ("adakv:prefill_chunk=64", "adakv: cannot prefill in chunks"),
    ("snapkv:prefill_chunk=-1", "'prefill_chunk' must be >= 0"),
    ("snapkv:prefill_chunk=big", "'prefill_chunk' must be int"),
])
def test_bad_compositions_and_chunks_are_one_line_usage_errors_at_collection(bench, spec, fragment):
    result = bench.runpytest(*GRID, "--kvbench-methods", spec)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert fragment in err and "Traceback" not in err + result.stdout.str()


def test_byte_budgets_and_compositions_are_grid_items_and_bad_fractions_usage_errors(bench):
    result = bench.runpytest(*GRID[:5], "m0.25", *GRID[6:], "--kvbench-methods",
                             "snapkv+kivi:bits=4,kivi,think+kivi,snapkv+think+kivi:bits=4")
    assert result.ret == 0
    assert sorted(collected_ids(result)) == ["kivi-m0.25-passage_retrieval_en",
                                             "snapkv+kivi(bits=4)-m0.25-passage_retrieval_en",
                                             "snapkv+think+kivi(bits=4)-m0.25-passage_retrieval_en",
                                             "think+kivi-m0.25-passage_retrieval_en"]
    result = bench.runpytest(*GRID[:5], "m1.5", *GRID[6:], "--kvbench-methods", "snapkv")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "fraction of the full cache's bytes must be in (0, 1]" in result.stderr.str()
