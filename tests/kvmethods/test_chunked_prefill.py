"""Chunked prefill with eviction (`prefill_chunk`): one chunk at least as long as the prompt is exactly
today's prefill; smaller chunks never let the cache grow past budget + chunk; the chunk is part of the id."""

from dataclasses import dataclass

import pytest
import torch

from kvmethods import MethodError, get_method, register_method, unregister_method
from kvmethods.runtime.generation import generate, prefill
from kvmethods.scorers.snapkv import SnapKV
from kvmethods.testing import tiny_model
from model_helpers import one_thread  # noqa: F401 (a module-scoped autouse fixture: applies here)
from helpers import GRID
from helpers import collected_ids

PROMPT = torch.randint(3, 256, (240,), generator=torch.Generator().manual_seed(9)).tolist()


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=3, qk_scale=4.0)


@pytest.mark.parametrize("spec", ["snapkv", "pyramidkv", "h2o", "streamingllm", "snapkv+kivi:group_size=16:residual=16"])
@pytest.mark.parametrize("protocol", ["question_in_window", "query_agnostic"])
def test_one_chunk_at_least_the_prompt_gives_identical_kept_positions_and_outputs(model, spec, protocol):
    name, *pairs = spec.split(":")
    params = dict(pair.split("=") for pair in pairs)
    plain = get_method(name, **params)
    for chunk in (len(PROMPT), 10 * len(PROMPT)):
        chunked = get_method(name, prefill_chunk=chunk, **params)
        assert chunked.params()["prefill_chunk"] == chunk
        one, other = (prefill(model, m, "64", PROMPT, 200, protocol) for m in (plain, chunked))
        for a, b in zip(one.kept_indices, other.kept_indices):
            assert (a is None and b is None) or torch.equal(a, b)
        first, second = (generate(model, m, "64", PROMPT, 200, 8, set(), protocol, return_logprobs=True)
                         for m in (plain, chunked))
        assert first.tokens == second.tokens and first.kept_tokens_per_layer == second.kept_tokens_per_layer
        assert torch.equal(first.logprobs, second.logprobs)


def test_small_chunks_keep_the_cache_within_budget_plus_chunk(model):
    seen: list[int] = []

    @dataclass
    class Watched(SnapKV):
        name = "watched_snapkv"

        def kept_indices(self, layer, n_keep):
            seen.append(layer.keys.shape[-2])  # what the layer holds at compression: kept + this chunk
            return super().kept_indices(layer, n_keep)

    register_method(Watched)
    try:
        out = generate(model, get_method("watched_snapkv", prefill_chunk=48), "32", PROMPT, 240, 4, set(),
                       "question_in_window")
    finally:
        unregister_method("watched_snapkv")
    assert out.kept_tokens_per_layer == [32] * model.config.num_hidden_layers
    assert max(seen) <= 32 + 48 and len(seen) > model.config.num_hidden_layers  # compressed after several chunks


def test_the_chunk_is_in_the_item_id(bench):
    result = bench.runpytest(*GRID, "--kvbench-methods", "snapkv:prefill_chunk=512,snapkv")
    assert sorted(collected_ids(result)) == ["snapkv(prefill_chunk=512)-64-passage_retrieval_en",
                                             "snapkv-64-passage_retrieval_en"]
    with pytest.raises(MethodError):
        get_method("kivi", prefill_chunk=64)
