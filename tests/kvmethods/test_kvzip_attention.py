"""KVzip's repeat-forward attention (kvzip_attention.py) computes what sdpa and the reconstruction score would.

The repeat forward's hidden states now come from this attention instead of sdpa: they must equal sdpa's
(float64 and float32 tolerances) on tiny GQA models, Llama and Qwen3 (whose queries pass q_norm). Its scores
must equal KVzip's definition, computed here by brute force from the RoPE'd queries and keys of one uncached
forward over context + repeat: per query head and repeat row, a softmax over [first sinks | chunk | repeat up
to the row], maxed over rows and the query heads of each KV head. Blocks of one query row and one block for all rows.
"""

import copy

import pytest
import torch

import kvmethods.scorers.kvzip as kvzip_module
from kvmethods.attention import kvzip_attention
from kvmethods import MethodError, get_method
from kvmethods.runtime.generation import prefill
from kvmethods.attention.kvzip_attention import ATTENTION_NAME, RepeatSpan, attend_and_score, scoring_attention
from kvmethods.testing import tiny_model
from kvmethods.adapters.transformers_compat import (AttentionInterface, DynamicCache, attention_implementation, cache_argument,
                                          sdpa_attention_forward)
from model_helpers import MatmulDtypes, one_thread  # noqa: F401 (one_thread applies here)

CONTEXT = torch.randint(3, 256, (96,), generator=torch.Generator().manual_seed(3)).tolist()
INSTRUCTION = [5, 6, 7]
# (start, end, sinks): the first chunk (no sinks, other context after it), a middle one (other context on both
# sides), the last one (other context before it only)
SPANS = [(0, 40, 0), (40, 80, 4), (80, 96, 4)]
SCRATCH = [1, 1 << 30]  # one repeat query row per block; every row in one block
CAPTURE = "kvbench_test_capture"


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def family(request):
    return request.param


def model_in(family, dtype):
    return tiny_model(family, seed=2, dtype=dtype, qk_scale=4.0)  # peaked attention, as in trained models


def context_cache(model):
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.tensor([CONTEXT]), use_cache=True, **cache_argument(model, cache))
    return cache


def repeat_forward(model, cache, repeat, outputs):
    """Appends each decoder layer's output for the repeat tokens, attending over the context's cache, to
    `outputs` (a forward under scoring_attention ends at the last layer's attention: that layer adds none)."""
    hooks = [layer.register_forward_hook(lambda module, args, output: outputs.append(output))
             for layer in model.model.layers]
    positions = torch.arange(len(CONTEXT), len(CONTEXT) + len(repeat)).unsqueeze(0)
    try:
        with torch.no_grad():
            decoder = model.get_decoder()
            decoder(input_ids=torch.tensor([repeat]), position_ids=positions, use_cache=True,
                    **cache_argument(decoder, cache))
    finally:
        for hook in hooks:
            hook.remove()


def empty_scores(model, dtype):
    heads = model.config.num_key_value_heads
    return [torch.zeros(1, heads, len(CONTEXT), dtype=dtype) for _ in range(model.config.num_hidden_layers)]


_captured: list[tuple[torch.Tensor, torch.Tensor]] = []


def capturing_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, **kwargs):
    """sdpa, keeping each layer's RoPE'd queries and keys for the brute force. Takes `dropout` by position,
    as transformers' attention functions do: kvpress's patch, once imported, calls every registered one so."""
    _captured.append((query[0], key[0]))
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, **kwargs)


AttentionInterface.register(CAPTURE, capturing_sdpa)


def brute_force_scores(model, start, end, sinks, repeat):
    """[layer][kv_head, end - start]: KVzip's score by loops over query heads and repeat rows, from the queries
    and keys of one uncached forward over context + repeat (float64 logits where the model is float64)."""
    T = len(CONTEXT)
    _captured.clear()
    model.set_attn_implementation(CAPTURE)
    try:
        with torch.no_grad():
            model(torch.tensor([CONTEXT + repeat]))
    finally:
        model.set_attn_implementation("sdpa")
    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    scores = []
    for queries, keys in _captured:
        layer = torch.zeros(keys.shape[0], end - start, dtype=keys.dtype)
        for head in range(queries.shape[0]):
            for row in range(len(repeat)):
                subset = list(range(sinks)) + list(range(start, end)) + list(range(T, T + row + 1))
                logits = keys[head // groups, subset] @ queries[head, T + row] * queries.shape[-1] ** -0.5
                chunk = torch.softmax(logits, dim=0)[sinks:sinks + end - start]
                layer[head // groups] = torch.maximum(layer[head // groups], chunk)
        scores.append(layer)
    return scores


@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("start, end, sinks", SPANS)
@pytest.mark.parametrize("scratch", SCRATCH)
def test_repeat_attention_equals_sdpa_and_its_scores_equal_the_brute_force(family, dtype, tolerance, start, end,
                                                                            sinks, scratch):
    model = model_in(family, dtype)
    repeat = INSTRUCTION + CONTEXT[start:end]
    cache = context_cache(model)
    expected, got = [], []
    repeat_forward(model, copy.deepcopy(cache), repeat, expected)
    span = RepeatSpan(len(CONTEXT), start, end, sinks, scratch, empty_scores(model, dtype))
    with scoring_attention(model, span):
        assert attention_implementation(model) == ATTENTION_NAME
        repeat_forward(model, cache, repeat, got)
    assert attention_implementation(model) == "sdpa"
    assert len(got) == model.config.num_hidden_layers - 1  # stopped at the last layer's attention
    for layer, (ours, theirs) in enumerate(zip(got, expected)):
        torch.testing.assert_close(ours, theirs, rtol=tolerance, atol=tolerance, msg=f"layer {layer}")
    assert span.scored_layers == set(range(model.config.num_hidden_layers))
    for layer, expected_scores in enumerate(brute_force_scores(model, start, end, sinks, repeat)):
        torch.testing.assert_close(span.scores[layer][0, :, start:end], expected_scores, rtol=tolerance,
                                   atol=tolerance)
        assert not span.scores[layer][..., :start].any() and not span.scores[layer][..., end:].any()


@pytest.mark.parametrize("start, end, sinks", SPANS)
@pytest.mark.parametrize("scratch", [1, 1 << 12, 1 << 30])
def test_attend_and_score_equals_sdpa_with_a_causal_mask_and_scores_alone_are_the_same(start, end, sinks, scratch):
    """At the function: random GQA tensors (8 query / 2 KV heads), the mask sdpa would get over a cache."""
    generator = torch.Generator().manual_seed(start)
    T, R, dim = len(CONTEXT), 5 + end - start, 16
    query = torch.randn(1, 8, R, dim, generator=generator, dtype=torch.float64) * 3
    key, value = (torch.randn(1, 2, T + R, dim, generator=generator, dtype=torch.float64) for _ in range(2))
    span = RepeatSpan(T, start, end, sinks, scratch, [])
    out, scores = attend_and_score(query, key, value, span, dim**-0.5)
    sees = torch.ones(R, T + R, dtype=torch.bool).tril_(T)  # row r: the context and repeat tokens up to r
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=sees, enable_gqa=True)
    torch.testing.assert_close(out, expected.transpose(1, 2), rtol=1e-12, atol=1e-12)
    alone, scores_alone = attend_and_score(query, key, value, span, dim**-0.5, with_output=False)
    assert alone is None
    torch.testing.assert_close(scores_alone, scores, rtol=1e-12, atol=1e-12)


def test_the_attention_implementation_is_restored_when_the_forward_raises(family):
    model = model_in(family, torch.float32)
    span = RepeatSpan(len(CONTEXT), 0, 40, 0, 1 << 19, empty_scores(model, torch.float32))
    with pytest.raises(RuntimeError, match="stop"):
        with scoring_attention(model, span):
            raise RuntimeError("stop")
    assert attention_implementation(model) == "sdpa"


def test_kvzip_refuses_a_model_whose_attention_bypasses_the_interface(family, monkeypatch):
    model = model_in(family, torch.float32)
    monkeypatch.setattr(model, "set_attn_implementation", lambda implementation: None)  # sdpa stays in place
    # the family probe (kvmethods/attention/model_probe.py) sees the bypass before kvzip's own per-layer check does
    with pytest.raises(MethodError, match=r"kvzip cannot compress model family .*layer \(0\) whose attention does not "
                                          r"go through transformers' attention interface"):
        prefill(model, get_method("kvzip", chunk_size=40), "30", CONTEXT, len(CONTEXT), "question_in_window")


def test_kvzip_scores_are_those_of_its_attention(family, monkeypatch):
    """Whole method: the scores kvzip ranks are the brute force's, chunk by chunk, sinks always kept."""
    model = model_in(family, torch.float64)
    monkeypatch.setattr(kvzip_module, "instruction_ids", lambda model: (tuple(INSTRUCTION), (8, 9), (10,)))
    cache = context_cache(model)
    scores = get_method("kvzip", chunk_size=40).prefill_scores(model, cache, torch.tensor([CONTEXT]))
    assert [layer.keys.shape[-2] for layer in cache.layers] == [len(CONTEXT)] * model.config.num_hidden_layers
    for start, end, sinks in SPANS:
        tail = [] if start == 0 else CONTEXT[max(0, start - 8):start]
        repeat = (INSTRUCTION if start == 0 else [8, 9] + tail) + [10] + CONTEXT[start:end]
        for layer, expected in enumerate(brute_force_scores(model, start, end, sinks, repeat)):
            got = scores[layer][0, :, start:end]
            if start == 0:
                got, expected = got[:, 4:], expected[:, 4:]  # the first n_sink tokens are set to inf (always kept)
            torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_a_half_precision_model_multiplies_in_its_dtype_and_sums_in_float32(monkeypatch):
    # bf16 inputs on an accelerator (product_dtype: the model's): the products run in bf16 (as the reference
    # scores in the model's dtype), the softmax and the scores in float32, so both stay within bf16's rounding
    # of the float64 computation; on a CPU the products run in float32
    generator = torch.Generator().manual_seed(1)
    T, R, dim = len(CONTEXT), 45, 16
    query = torch.randn(1, 8, R, dim, generator=generator, dtype=torch.float64) * 3
    key, value = (torch.randn(1, 2, T + R, dim, generator=generator, dtype=torch.float64) for _ in range(2))
    span = RepeatSpan(T, 40, 80, 4, 1 << 12, [])
    exact_out, exact_scores = attend_and_score(query, key, value, span, dim**-0.5)
    with MatmulDtypes() as matmuls:
        attend_and_score(query.bfloat16(), key.bfloat16(), value.bfloat16(), span, dim**-0.5)
    assert matmuls.dtypes == {torch.float32}
    monkeypatch.setattr(kvzip_attention, "product_dtype", lambda tensor: tensor.dtype)
    with MatmulDtypes() as matmuls:
        out, scores = attend_and_score(query.bfloat16(), key.bfloat16(), value.bfloat16(), span, dim**-0.5)
    assert matmuls.dtypes == {torch.bfloat16}
    assert out.dtype == scores.dtype == torch.float32
    torch.testing.assert_close(out.double(), exact_out, rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(scores.double(), exact_scores, rtol=5e-2, atol=1e-2)


def test_blocks_hold_a_minimum_of_repeat_rows_at_long_contexts_and_are_sized_by_bytes_on_a_gpu(monkeypatch):
    cache = DynamicCache()
    cache.layers.append(type("Layer", (), {"keys": torch.zeros(1, 8, 1, 128, dtype=torch.bfloat16)})())
    groups, columns = 4, 32768 + 2070  # Llama-3-8B's 8 KV heads of 4 query heads, a 32k context and its repeat
    scratch = kvzip_module.block_scratch(cache, 8, groups, columns)
    assert scratch // (groups * columns) == kvzip_module.MIN_BLOCK_ROWS  # not the 3 rows of 2^19 logits
    assert kvzip_module.block_scratch(cache, 8, groups, 1024) == kvzip_module.SCRATCH_ELEMENTS  # short: L2-sized
    monkeypatch.setattr(torch.Tensor, "device", property(lambda self: torch.device("cuda")))
    gpu = kvzip_module.block_scratch(cache, 8, groups, columns)
    assert gpu * 8 * 4 == kvzip_module.GPU_SCRATCH_BYTES and gpu // (groups * columns) > kvzip_module.MIN_BLOCK_ROWS
