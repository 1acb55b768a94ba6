"""criticalkv, expected_attention and kvzip keep what a brute-force reference of their paper's rule keeps.

As in test_methods_selection.py, the reference side runs the same float64 weights with eager attention
and plain loops over heads and tokens (the o_proj module applied to one head's slot for CriticalKV, the
RoPE rotation built from the model's own apply_rotary_pos_emb for ExpectedAttention, full-prompt eager
attention renormalised over the reconstruction's key subset for KVzip); the method side runs sdpa.
"""

import pytest
import torch
from test_methods_selection import avg_pool_reference, group_mean, kept_sets, top_set
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import kvmethods.scorers.kvzip as kvzip_module
from kvmethods import Budget, MethodError, get_method
from kvmethods.runtime.generation import generate, prefill
from model_helpers import FAMILIES, one_thread, sdpa_and_eager  # noqa: F401 (one_thread applies here)

PROMPT_LEN = 96


@pytest.fixture(scope="module", params=FAMILIES)
def models(request):
    sdpa, eager = sdpa_and_eager(request.param, seed=1, qk_scale=10.0)
    ids = torch.randint(3, 256, (PROMPT_LEN,), generator=torch.Generator().manual_seed(7)).tolist()
    with torch.no_grad():
        out = eager(torch.tensor([ids]), output_attentions=True, output_hidden_states=True)
    plain = prefill(sdpa, get_method("full"), Budget.parse("1000"), ids, len(ids), "question_in_window")
    return sdpa, eager, ids, [a[0] for a in out.attentions], out.hidden_states, plain.cache


def groups_of(model):
    return model.config.num_attention_heads // model.config.num_key_value_heads


def snapkv_scores_reference(attn, groups, window, kernel):
    T = attn.shape[-1]
    votes = group_mean(attn[:, T - window:, : T - window].mean(1), groups)
    return [torch.cat([avg_pool_reference(head, kernel), torch.full((window,), float("inf"), dtype=head.dtype)])
            for head in votes]


def value_output_norms_reference(module, values, groups):
    """Per KV head and token: ||o_proj(v placed in query head h's slot)||_1, averaged over its query heads."""
    heads, T, dim = values.shape
    norms = torch.zeros(heads, T, dtype=torch.float64)
    for k in range(heads):
        for t in range(T):
            total = 0.0
            for h in range(k * groups, (k + 1) * groups):
                slot = torch.zeros(heads * groups * dim, dtype=values.dtype)
                slot[h * dim:(h + 1) * dim] = values[k, t]
                total += float(module.o_proj(slot).abs().sum())
            norms[k, t] = total / groups
    return norms


@pytest.mark.parametrize("first_stage_ratio", [0.5, 0.0])
def test_criticalkv_matches_reference(models, first_stage_ratio):
    model, _, ids, attentions, _, plain = models
    budget, window, kernel, epsilon = 40, 8, 5, 1e-4
    method = get_method("criticalkv", window=window, kernel=kernel, first_stage_ratio=first_stage_ratio)
    kept, _ = kept_sets(model, method, str(budget), ids)
    groups = groups_of(model)
    with torch.no_grad():
        for layer, attn in enumerate(attentions):
            base = snapkv_scores_reference(attn, groups, window, kernel)
            values = plain.layers[layer].values[0]
            norms = value_output_norms_reference(model.model.layers[layer].self_attn, values, groups)
            expected = []
            for head in range(len(base)):
                first = top_set(base[head], max(1, int(budget * first_stage_ratio))) if first_stage_ratio else set()
                rescaled = [float("-inf") if t in first else (float(base[head][t]) + epsilon) * float(norms[head, t])
                            for t in range(len(ids))]
                expected.append(first | top_set(rescaled, budget - len(first)))
            assert kept[layer] == expected


def prerope_queries_reference(attention, hidden):
    """[q_heads, T, dim] from the layer's input hidden states through q_proj (and Qwen3's q_norm)."""
    q = attention.q_proj(hidden).view(hidden.shape[0], -1, attention.head_dim)
    if getattr(attention, "q_norm", None) is not None:
        q = attention.q_norm(q)
    return q.transpose(0, 1)


def expected_attention_reference(model, layer_idx, hidden_states, cache, n_future, sinks, budget):
    layer = model.model.layers[layer_idx]
    q = prerope_queries_reference(layer.self_attn, layer.input_layernorm(hidden_states[layer_idx][0]))[:, sinks:]
    T, dim = hidden_states[0].shape[1], layer.self_attn.head_dim
    identity = torch.eye(dim, dtype=torch.float64).unsqueeze(0)  # rotate every basis vector
    positions = torch.arange(T, T + n_future).unsqueeze(0)
    cos, sin = model.model.rotary_emb(identity, positions)
    rotation = torch.stack([apply_rotary_pos_emb(identity.unsqueeze(0), identity.unsqueeze(0),
                                                 cos[:, p:p + 1], sin[:, p:p + 1])[0][0, 0].T
                            for p in range(n_future)]).mean(0)
    keys, values = cache.layers[layer_idx].keys[0], cache.layers[layer_idx].values[0]
    groups = q.shape[0] // keys.shape[0]
    kept = []
    for k in range(keys.shape[0]):
        per_head = []
        for h in range(k * groups, (k + 1) * groups):
            mean = q[h].mean(0)
            cov = sum(torch.outer(x - mean, x - mean) for x in q[h]) / q.shape[1]
            mean, cov = rotation @ mean, rotation @ cov @ rotation.T
            logits = torch.stack([key @ mean / dim**0.5 + key @ cov @ key / (2 * dim) for key in keys[k, sinks:]])
            per_head.append(logits.softmax(0))
        scores = torch.stack(per_head).mean(0) * values[k, sinks:].norm(dim=-1)
        kept.append(set(range(sinks)) | {t + sinks for t in top_set(scores, budget - sinks)})
    return kept


def test_expected_attention_matches_reference(models):
    model, _, ids, _, hidden_states, plain = models
    method = get_method("expected_attention", n_future_positions=16)
    kept, _ = kept_sets(model, method, "30", ids)
    with torch.no_grad():
        for layer in range(model.config.num_hidden_layers):
            assert kept[layer] == expected_attention_reference(model, layer, hidden_states, plain, 16, 4, 30)


def kvzip_reference(eager, ids, chunk_size, instructions, sinks, budget):
    first, later, suffix = instructions
    T, groups = len(ids), groups_of(eager)
    scores = None
    for start in range(0, T, chunk_size):
        end = min(T, start + chunk_size)
        instruction = list(first) if start == 0 else list(later) + ids[max(0, start - 8):start]
        repeat = instruction + list(suffix) + ids[start:end]
        with torch.no_grad():
            attentions = eager(torch.tensor([ids + repeat]), output_attentions=True).attentions
        if scores is None:
            scores = [torch.zeros(a.shape[1] // groups, T, dtype=torch.float64) for a in attentions]
        subset = list(range(min(sinks, start))) + list(range(start, end)) + list(range(T, T + len(repeat)))
        for layer, attn in enumerate(attentions):
            rows = attn[0, :, T:][:, :, subset]  # [q_heads, R, |subset|]
            rows = rows / rows.sum(-1, keepdim=True)  # the softmax restricted to the subset
            chunk = rows[:, :, min(sinks, start):min(sinks, start) + end - start].amax(1)
            for k in range(scores[layer].shape[0]):
                scores[layer][k, start:end] = chunk[k * groups:(k + 1) * groups].amax(0)
    return [[set(range(sinks)) | {t + sinks for t in top_set(head[sinks:], budget - sinks)} for head in layer]
            for layer in scores]


# scratch of 1 logit: one repeat query per block; 1 << 30: all repeat queries in one block
@pytest.mark.parametrize("instructions, scratch", [(((), (), ()), 1 << 30), (((5, 6, 7), (8, 9), (10, 11)), 1)])
def test_kvzip_matches_reference(models, monkeypatch, instructions, scratch):
    model, eager, ids, _, _, _ = models
    monkeypatch.setattr(kvzip_module, "instruction_ids", lambda model: instructions)
    monkeypatch.setattr(kvzip_module, "SCRATCH_ELEMENTS", scratch)  # blocks of repeat queries
    monkeypatch.setattr(kvzip_module, "MIN_BLOCK_ROWS", 1)
    kept, state = kept_sets(model, get_method("kvzip", chunk_size=40), "30", ids)
    assert kept == kvzip_reference(eager, ids, 40, instructions, 4, 30)
    assert [layer.keys.shape[-2] for layer in state.cache.layers] == [30] * model.config.num_hidden_layers


def test_kvzip_reports_its_scoring_forward_and_leaves_the_cache_as_it_was(models):
    model, _, ids, _, _, plain = models
    out = generate(model, get_method("kvzip", chunk_size=40), "r0", ids, 60, 3, set(), "query_agnostic")
    assert out.scoring_s == 0.0  # nothing compressed, nothing scored
    out = generate(model, get_method("kvzip", chunk_size=40), "30", ids, 60, 3, set(), "query_agnostic")
    assert 0.0 < out.scoring_s < out.prefill_s
    assert out.kept_tokens_per_layer == [30 + len(ids) - 60] * model.config.num_hidden_layers
    state = prefill(model, get_method("kvzip", chunk_size=40), "30", ids, len(ids), "question_in_window")
    for i, (layer, full) in enumerate(zip(state.cache.layers, plain.layers)):  # the prefill's rows, no repeat
        for head, kept in enumerate(state.kept_indices[i][0]):
            torch.testing.assert_close(layer.keys[0, head], full.keys[0, head, kept], rtol=0, atol=0)


@pytest.mark.parametrize("base", ["criticalkv", "expected_attention", "kvzip"])
def test_each_new_scorer_runs_under_adakv_with_the_shared_budget(models, base):
    model, _, ids, _, _, _ = models
    out = generate(model, get_method("adakv", base=base), "24", ids, 80, 2, set(), "query_agnostic")
    heads = model.config.num_key_value_heads
    assert [sum(h) for h in out.kept_tokens_per_head] == [heads * (24 + 16)] * model.config.num_hidden_layers
    assert out.kv_bytes_physical == out.kv_bytes_logical


def test_adakv_across_layers_shares_one_budget_over_every_layer_and_head(models):
    model, _, ids, _, _, _ = models
    method = get_method("adakv", base="kvzip", alpha=0, across_layers=True, chunk_size=40)
    out = generate(model, method, "30", ids, len(ids), 2, set(), "question_in_window")
    layers, heads = model.config.num_hidden_layers, model.config.num_key_value_heads
    totals = [sum(h) for h in out.kept_tokens_per_head]
    assert sum(totals) == layers * heads * 30 and len(set(totals)) > 1  # layers differ, the sum is the budget
    assert out.kv_bytes_physical == out.kv_bytes_logical


@pytest.mark.parametrize("name, params, fragment", [
    ("adakv", {"base": "snapkv", "across_layers": "true"}, "across_layers needs a base that scores the whole prompt"),
    ("criticalkv", {"base": "streamingllm"}, "cannot be wrapped"),
    ("criticalkv", {"base": "kvzip"}, "cannot be wrapped"),
    ("criticalkv", {"first_stage_ratio": "2"}, "must be in [0, 1]"),
    ("expected_attention", {"n_future_positions": "0"}, ">= 1"),
    ("kvzip", {"chunk_size": "big"}, "'chunk_size' must be int"),
])
def test_bad_parameters_are_one_line_method_errors(name, params, fragment):
    with pytest.raises(MethodError) as caught:
        get_method(name, **params)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)
