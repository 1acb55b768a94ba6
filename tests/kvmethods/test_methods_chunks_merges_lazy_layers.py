"""chunkkv (whole chunks), merge (evicted values folded into kept ones) and simlayerkv (lazy layers), on tiny models.

What must hold beyond agreeing with kvpress (test_kvpress_wrappers.py): chunkkv keeps exactly the budget in whole
chunks, every head the same; merge keeps its base's positions and keys, and only its values change; simlayerkv
keeps sinks + recent tokens in lazy layers and everything in the others, and the records count what they hold;
each refuses what it cannot serve in one line naming both sides.
"""

import pytest
import torch

from kvmethods import MethodError, get_method
from kvmethods.runtime.generation import generate, prefill
from kvmethods.testing import tiny_model
from kvmethods.wrappers.chunkkv import chunk_scores
from model_helpers import one_thread  # noqa: F401 (one_thread applies here)

PROMPT = torch.randint(3, 256, (64,), generator=torch.Generator().manual_seed(11)).tolist()


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(request):
    return tiny_model(request.param, seed=3, qk_scale=4.0)


def test_chunk_scores_average_the_head_sum_over_each_chunk_the_last_one_shorter():
    scores = torch.tensor([[[1.0, 3.0, 5.0, 7.0, 9.0], [1.0, 1.0, 1.0, 1.0, 3.0]]])
    assert chunk_scores(scores, 2).tolist() == [[[3.0, 3.0, 7.0, 7.0, 12.0]] * 2]


@pytest.mark.parametrize("budget", ["24", "r0.5", "13"])
def test_chunkkv_keeps_the_budget_in_whole_chunks_every_head_the_same(model, budget):
    state = prefill(model, get_method("chunkkv", base="knorm", chunk_length=8), budget, PROMPT, len(PROMPT),
                    "question_in_window")
    n_keep = state.kept_indices[0].shape[-1]
    for kept in state.kept_indices:
        assert all(torch.equal(head, kept[0, 0]) for head in kept[0])
        chunks = {}
        for position in kept[0, 0].tolist():
            chunks.setdefault(position // 8, []).append(position)
        cut = [chunk for chunk, positions in chunks.items() if len(positions) < 8]
        assert len(cut) == (n_keep % 8 > 0)  # at most one chunk cut, only when the budget is not whole chunks
        for chunk in cut:  # cut to its earliest positions
            assert chunks[chunk] == list(range(chunk * 8, chunk * 8 + len(chunks[chunk])))


def test_chunkkv_over_a_prompt_shorter_than_a_chunk_is_its_base(model):
    ours = prefill(model, get_method("chunkkv", base="snapkv", window=4, chunk_length=100), "20", PROMPT, len(PROMPT),
                   "question_in_window")
    base = prefill(model, get_method("snapkv", window=4), "20", PROMPT, len(PROMPT), "question_in_window")
    assert all(torch.equal(a, b) for a, b in zip(ours.kept_indices, base.kept_indices))


def test_merge_keeps_its_bases_positions_and_keys_and_changes_values(model):
    merged = prefill(model, get_method("merge", base="snapkv", window=4), "20", PROMPT, len(PROMPT),
                     "question_in_window")
    plain = prefill(model, get_method("snapkv", window=4), "20", PROMPT, len(PROMPT), "question_in_window")
    assert all(torch.equal(a, b) for a, b in zip(merged.kept_indices, plain.kept_indices))
    assert all(torch.equal(a.keys, b.keys) for a, b in zip(merged.cache.layers, plain.cache.layers))
    assert not all(torch.equal(a.values, b.values) for a, b in zip(merged.cache.layers, plain.cache.layers))
    out = generate(model, get_method("merge", base="snapkv", window=4), "20", PROMPT, len(PROMPT), 4, set(),
                   "question_in_window")
    assert out.kept_tokens_per_layer == [20] * model.config.num_hidden_layers


def test_merge_folds_an_evicted_value_into_its_most_similar_kept_key():
    method = get_method("merge", base="knorm")
    keys = torch.tensor([[[[1.0, 0.0], [0.0, 1.0], [0.9, 0.1]]]])  # the evicted third is closest to the first
    values = torch.tensor([[[[2.0, 0.0], [0.0, 4.0], [0.0, 2.0]]]])
    kept = method.kept_values(keys, values, torch.tensor([[[0, 1]]]))
    similarity = 0.9 / (0.9 ** 2 + 0.1 ** 2) ** 0.5
    weight = similarity * 2.0 / (2.0 + 2.0 + 1e-6)
    torch.testing.assert_close(kept[0, 0, 0], torch.tensor([2.0, 2.0 * weight]) / (1 + weight))
    assert kept[0, 0, 1].tolist() == [0.0, 4.0]  # nothing merged into the second


@pytest.mark.parametrize("name, params, message", [
    ("chunkkv", {"base": "streamingllm"}, "chunkkv: base 'streamingllm' cannot be wrapped"),
    ("merge", {"base": "full"}, "merge: base 'full' cannot be wrapped"),
    ("merge", {"base": "simlayerkv"}, "merge: base 'simlayerkv' cannot be wrapped"),
    ("adakv", {"base": "merge"}, "adakv: base 'merge' cannot be wrapped"),
    ("chunkkv", {"base": "merge"}, "chunkkv: base 'merge' cannot be wrapped"),
    ("merge", {"merge_fraction": "0"}, "merge: parameter 'merge_fraction' must be in (0, 1]"),
    ("merge", {"similarity_threshold": "1.5"}, "merge: parameter 'similarity_threshold' must be in [0, 1]"),
    ("chunkkv", {"chunk_length": "0"}, "chunkkv: parameter 'chunk_length' must be >= 1"),
    ("simlayerkv", {"threshold": "2"}, "simlayerkv: parameter 'threshold' must be in [0, 1]"),
    ("simlayerkv", {"last": "0"}, "simlayerkv: parameter 'last' must be >= 1"),
])
def test_what_they_cannot_serve_is_one_line(name, params, message):
    with pytest.raises(MethodError) as refused:
        get_method(name, **params)
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_simlayerkv_keeps_sinks_and_recent_tokens_in_lazy_layers_and_everything_elsewhere(model):
    layers = model.config.num_hidden_layers
    everything = generate(model, get_method("simlayerkv", threshold=0.0), "16", PROMPT, len(PROMPT), 4, set(),
                          "question_in_window")
    streaming = generate(model, get_method("streamingllm", sinks=4), "16", PROMPT, len(PROMPT), 4, set(),
                         "question_in_window")
    assert everything.kept_tokens_per_layer == [16] * layers  # every layer lazy: StreamingLLM's cache
    assert everything.tokens == streaming.tokens
    whole = generate(model, get_method("simlayerkv", threshold=1.0), "16", PROMPT, len(PROMPT), 4, set(),
                     "question_in_window")
    assert whole.kept_tokens_per_layer == [len(PROMPT)] * layers and whole.kv_bytes_after == whole.kv_bytes_before
    state = prefill(model, get_method("simlayerkv", threshold=0.0), "16", PROMPT, len(PROMPT), "question_in_window")
    assert state.kept_indices[0][0, 0].tolist() == [0, 1, 2, 3, *range(len(PROMPT) - 12, len(PROMPT))]


def test_a_byte_budget_counts_what_simlayerkvs_whole_layers_hold(model):
    out = generate(model, get_method("simlayerkv", threshold=1.0), "m0.25", PROMPT, len(PROMPT), 2, set(),
                   "question_in_window")
    assert out.kv_bytes_after == out.kv_bytes_before  # no layer lazy: everything held, over the budget
    assert out.kv_bytes_budget == pytest.approx(0.25 * out.kv_bytes_before, rel=0.01)
    lazy = generate(model, get_method("simlayerkv", threshold=0.0), "m0.25", PROMPT, len(PROMPT), 2, set(),
                    "question_in_window")
    assert lazy.kv_bytes_after <= lazy.kv_bytes_budget


@pytest.mark.parametrize("name", ["chunkkv", "merge", "criticalkv", "simlayerkv", "capkv"])
def test_each_recompresses_after_every_turn_its_bases_window_shrunk_to_the_turn(model, name):
    """per_turn scores with the turn's tokens: a base's window (snapkv's 32) longer than the turn shrinks to it,
    as a scorer's own does."""
    from kvmethods.runtime.protocols import run_turns

    params = {"threshold": 0.0} if name == "simlayerkv" else {}
    questions = [list(range(100, 108)), list(range(120, 126))]
    outs = run_turns(model, get_method(name, per_turn=True, **params), "16", PROMPT, questions, 3, set())
    snapkv = run_turns(model, get_method("snapkv", per_turn=True), "16", PROMPT, questions, 3, set())
    assert len(outs) == 2 and all(len(out.tokens) == 3 for out in outs)
    assert [out.kept_tokens_per_layer for out in outs] == [out.kept_tokens_per_layer for out in snapkv]  # cut back
