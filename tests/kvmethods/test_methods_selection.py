"""Kept positions equal an independent brute-force reference built from eager attention weights.

The reference side runs the same weights with attn_implementation="eager" and output_attentions=True
(the full T x T matrices) and applies each paper's rule with plain loops; the method side runs sdpa and
recomputes what it needs inside the hooks. Eager softmax runs in float32 even for float64 models, so the
models get peaked attention (qk_scale) to keep top-k boundaries well above that rounding.
"""

from dataclasses import replace

import pytest
import torch

from kvmethods import Budget, get_method
from kvmethods.runtime.generation import prefill
from kvmethods.scorers import scoring
from kvmethods.scorers.scoring import accumulated_attention
from kvmethods.testing import first_layer_inputs, tiny_model
from model_helpers import MatmulDtypes, one_thread  # noqa: F401 (one_thread: a module-scoped autouse fixture)

FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]
PROMPT_LEN = 96




@pytest.fixture(scope="module", params=FAMILIES)
def models(request):
    sdpa = tiny_model(request.param, seed=1, dtype=torch.float64, qk_scale=10.0)
    eager = tiny_model(request.param, seed=2, dtype=torch.float64, attn_implementation="eager")
    eager.load_state_dict(sdpa.state_dict())
    ids = torch.randint(3, 256, (PROMPT_LEN,), generator=torch.Generator().manual_seed(7)).tolist()
    with torch.no_grad():
        attentions = eager(torch.tensor([ids]), output_attentions=True).attentions
    return sdpa, [a[0] for a in attentions], ids  # per layer [q_heads, T, T]


def group_mean(per_q_head, groups):
    """[q_heads, ...] -> [kv_heads, ...], q head h belongs to kv head h // groups."""
    return torch.stack([per_q_head[k * groups:(k + 1) * groups].mean(0) for k in range(per_q_head.shape[0] // groups)])


def avg_pool_reference(row, kernel):
    """Stride-1 average with zero padding counted in the denominator (count_include_pad)."""
    half, out = kernel // 2, torch.zeros_like(row)
    for p in range(len(row)):
        out[p] = sum(row[j] for j in range(p - half, p + half + 1) if 0 <= j < len(row)) / kernel
    return out


def max_pool_reference(row, kernel):
    half = kernel // 2
    return torch.stack([row[max(0, p - half):p + half + 1].max() for p in range(len(row))])


def top_set(scores, n):
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))
    return set(order[:n])


def snapkv_reference(attn, groups, budget, window, kernel, pooling):
    T = attn.shape[-1]
    votes = group_mean(attn[:, T - window:, : T - window].sum(1), groups)
    pool = {"avgpool": avg_pool_reference, "maxpool": max_pool_reference, "none": lambda r, k: r}[pooling]
    return [top_set(pool(head, kernel), budget - window) | set(range(T - window, T)) for head in votes]


def h2o_reference(attn, groups, budget, recent_ratio):
    T = attn.shape[-1]
    recent = int(budget * recent_ratio)
    totals = group_mean(attn.sum(1), groups)
    return [top_set(head[: T - recent], budget - recent) | set(range(T - recent, T)) for head in totals]


def tova_reference(attn, kv_heads, budget):
    T = attn.shape[-1]
    last = attn[:, -1, : T - 1].mean(0)
    return [top_set(last, budget - 1) | {T - 1}] * kv_heads


def kept_sets(model, method, budget, ids):
    state = prefill(model, method, Budget.parse(budget), ids, len(ids), "question_in_window")
    return [[set(head.tolist()) for head in layer[0]] for layer in state.kept_indices], state


@pytest.mark.parametrize("params", [{"window": 8, "kernel": 5}, {"window": 16, "kernel": 3, "pooling": "maxpool"},
                                    {"window": 4, "pooling": "none"}])
def test_snapkv_matches_reference(models, params):
    model, attentions, ids = models
    method = get_method("snapkv", **params)
    kept, _ = kept_sets(model, method, "40", ids)
    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    for layer, attn in enumerate(attentions):
        assert kept[layer] == snapkv_reference(attn, groups, 40, method.window, method.kernel, method.pooling)


@pytest.mark.parametrize("recent_ratio", [0.5, 0.25])
def test_h2o_matches_reference(models, recent_ratio):
    model, attentions, ids = models
    kept, _ = kept_sets(model, get_method("h2o", recent_ratio=recent_ratio), "36", ids)
    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    for layer, attn in enumerate(attentions):
        assert kept[layer] == h2o_reference(attn, groups, 36, recent_ratio)


def test_tova_matches_reference(models):
    model, attentions, ids = models
    kept, _ = kept_sets(model, get_method("tova"), "30", ids)
    for layer, attn in enumerate(attentions):
        assert kept[layer] == tova_reference(attn, model.config.num_key_value_heads, 30)


def test_pyramidkv_matches_reference_with_decreasing_budgets_averaging_to_the_budget(models):
    model, attentions, ids = models
    method = get_method("pyramidkv", window=8, kernel=5)
    kept, state = kept_sets(model, method, "40", ids)
    lengths = [state.cache.layers[i].keys.shape[-2] for i in range(len(attentions))]
    assert sum(lengths) == 40 * len(lengths)
    assert lengths == sorted(lengths, reverse=True) and lengths[0] > lengths[-1]
    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    for layer, attn in enumerate(attentions):
        assert kept[layer] == snapkv_reference(attn, groups, lengths[layer], 8, 5, "avgpool")


def test_knorm_keeps_lowest_key_norms_and_streamingllm_sinks_plus_recent(models):
    model, _, ids = models
    plain = prefill(model, get_method("full"), Budget.parse("1000"), ids, len(ids), "question_in_window")
    kept, _ = kept_sets(model, get_method("knorm"), "24", ids)
    for layer, layer_kept in enumerate(kept):
        norms = plain.cache.layers[layer].keys[0].norm(dim=-1)
        assert layer_kept == [top_set(-head, 24) for head in norms]
    kept, state = kept_sets(model, get_method("streamingllm", sinks=4), "24", ids)
    expected = set(range(4)) | set(range(PROMPT_LEN - 20, PROMPT_LEN))
    assert all(head == expected for layer in kept for head in layer)
    for layer in range(len(kept)):  # the kept rows are exactly those of the uncompressed cache
        rows = sorted(expected)
        assert torch.equal(state.cache.layers[layer].keys[0], plain.cache.layers[layer].keys[0][:, rows])
        assert torch.equal(state.cache.layers[layer].values[0], plain.cache.layers[layer].values[0][:, rows])


def test_random_is_reproducible_per_seed(models):
    model, _, ids = models
    first, _ = kept_sets(model, get_method("random", seed=3), "24", ids)
    again, _ = kept_sets(model, get_method("random", seed=3), "24", ids)
    other, _ = kept_sets(model, get_method("random", seed=4), "24", ids)
    assert first == again and first != other


def test_accumulated_attention_is_independent_of_chunking(models):
    model, attentions, ids = models
    inputs = first_layer_inputs(model, torch.tensor([ids]), num_layers=1)
    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    expected = group_mean(attentions[0].sum(1), groups)
    whole = accumulated_attention(inputs, scratch_bytes=2**30)[0]  # everything in one block
    torch.testing.assert_close(whole, expected, rtol=1e-6, atol=1e-8)  # eager softmax is float32
    for scratch in (1, 4096):  # one query row per chunk, a few rows per chunk
        chunked = accumulated_attention(inputs, scratch_bytes=scratch)[0]
        torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-14)


def test_accumulated_attention_of_a_half_precision_model_sums_in_float32(models, monkeypatch):
    # bf16 inputs: on a CPU the products run in float32; on an accelerator (product_dtype: the model's) the
    # logits and probabilities are bf16 (H2O's reference) and the column sums float32, so the scores stay
    # within bf16's rounding of the float64 ones however many query rows are summed
    model, attentions, ids = models
    full = first_layer_inputs(model, torch.tensor([ids]), num_layers=1)
    exact = accumulated_attention(full, scratch_bytes=2**30)
    half = replace(full, keys=full.keys.bfloat16(), values=full.values.bfloat16(),
                   projected_queries=full.module.q_proj(full.hidden_states).bfloat16())
    with MatmulDtypes() as matmuls:
        on_cpu = accumulated_attention(half, scratch_bytes=2**30)
    assert matmuls.dtypes == {torch.float32}
    torch.testing.assert_close(on_cpu.double(), exact, rtol=3e-2, atol=3e-3)
    monkeypatch.setattr(scoring, "product_dtype", lambda tensor: tensor.dtype)  # as on an accelerator
    for scratch in (64, 2**30):  # one row per chunk (many float32 additions), everything at once
        with MatmulDtypes() as matmuls:
            got = accumulated_attention(half, scratch_bytes=scratch)
        assert matmuls.dtypes == {torch.bfloat16}  # the query-key products in the model's dtype
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), exact, rtol=3e-2, atol=3e-3)
