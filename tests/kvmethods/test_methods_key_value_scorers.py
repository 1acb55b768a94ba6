"""keydiff, lagkv, curdkv and leverage keep what a plain-loop reference of their paper's rule keeps.

They score the cached keys and values alone (no attention), so the reference reads the full cache of a plain
prefill and loops over heads and tokens in float64; the kvpress agreement of the same methods is in
test_kvpress_adapter.py (kvpress's environment only), this file runs everywhere.
"""

import math

import pytest
import torch
from test_methods_selection import kept_sets, top_set

from kvmethods import Budget, MethodError, get_method
from kvmethods.runtime.generation import generate, prefill
from kvmethods.testing import tiny_model
from model_helpers import FAMILIES, one_thread  # noqa: F401 (one_thread applies here)

PROMPT_LEN = 96


@pytest.fixture(scope="module", params=FAMILIES)
def models(request):
    model = tiny_model(request.param, seed=1, dtype=torch.float64, qk_scale=10.0)
    ids = torch.randint(3, 256, (PROMPT_LEN,), generator=torch.Generator().manual_seed(7)).tolist()
    plain = prefill(model, get_method("full"), Budget.parse("1000"), ids, len(ids), "question_in_window")
    return model, ids, plain.cache


def keydiff_reference(keys, budget):
    """Per head: minus the cosine of each key with the mean of the unit keys."""
    kept = []
    for head in keys:
        anchor = sum(key / key.norm() for key in head) / len(head)
        kept.append(top_set([-float(key @ anchor / (key.norm() * anchor.norm())) for key in head], budget))
    return kept


@pytest.mark.parametrize("budget", [30, 60])
def test_keydiff_matches_reference(models, budget):
    model, ids, plain = models
    kept, _ = kept_sets(model, get_method("keydiff"), str(budget), ids)
    for layer, cached in enumerate(plain.layers):
        assert kept[layer] == keydiff_reference(cached.keys[0], budget)


def lagkv_reference(keys, values, budget, n_sink, lag, cross_scoring):
    """Per head: sinks and the last partition + remainder first; each earlier partition's tokens by the softmax
    over the partition of their channels' std, min-max scaled by the next partition's range (keys and values
    averaged), or by their rank in the partition over lag."""
    T = keys.shape[1]
    partitions = (T - n_sink) // lag
    kept = []
    for head in range(keys.shape[0]):
        scores = [1.0] * T
        for p in range(partitions - 1):
            start = n_sink + p * lag
            per_token = torch.zeros(lag, dtype=torch.float64)
            for states in (keys[head], values[head]):
                reference = states[start + lag:start + 2 * lag]
                low, high = reference.min(0).values, reference.max(0).values
                spread = torch.stack([((states[start + t] - low) / (high - low)).std() for t in range(lag)])
                per_token += spread.softmax(0) / 2
            ranked = per_token if cross_scoring else torch.tensor(
                [sum(float(other) < float(mine) for other in per_token) / lag for mine in per_token])
            scores[start:start + lag] = ranked.tolist()
        kept.append(top_set(scores, budget))
    return kept


@pytest.mark.parametrize("params, budget", [({"lag_size": 16}, 40), ({"lag_size": 16}, 42),
                                            ({"lag_size": 8, "n_sink": 2, "cross_scoring": True}, 30)])
def test_lagkv_matches_reference(models, params, budget):
    model, ids, plain = models
    method = get_method("lagkv", **params)
    kept, _ = kept_sets(model, method, str(budget), ids)
    for layer, cached in enumerate(plain.layers):
        assert kept[layer] == lagkv_reference(cached.keys[0], cached.values[0], budget, method.n_sink,
                                              method.lag_size, method.cross_scoring)


def test_lagkv_keeps_the_sinks_and_the_most_recent_tokens_of_a_short_prompt(models):
    model, ids, _ = models
    kept, _ = kept_sets(model, get_method("lagkv", lag_size=64), "40", ids)  # 96 < 4 + 2 x 64
    assert all(head == set(range(4)) | set(range(PROMPT_LEN - 36, PROMPT_LEN)) for layer in kept for head in layer)


def curdkv_reference(keys, values, budget, n_sink, leverage_type, window):
    """Per head: each token's squared key and value norms over their window's sums (window None: as they are),
    combined, over the prompt's total; the first n_sink tokens 1."""
    T = keys.shape[1]
    kept = []
    for head in range(keys.shape[0]):
        leverages = []
        for states in (keys[head], values[head]):
            squares = [float(row @ row) for row in states]
            if window is not None:
                squares = [s / sum(squares[t // window * window:(t // window + 1) * window]) for t, s in enumerate(squares)]
            leverages.append(squares)
        k2, v2 = leverages
        combined = {"key": k2, "value": v2, "kv_avg": [(k + v) / 2 for k, v in zip(k2, v2)],
                    "kv_product": [k * v for k, v in zip(k2, v2)]}[leverage_type]
        scores = [1.0 if t < n_sink else combined[t] / sum(combined) for t in range(T)]
        kept.append(top_set(scores, budget))
    return kept


@pytest.mark.parametrize("params", [{}, {"leverage_type": "kv_avg", "local_window_size": 7, "n_sink": 0},
                                    {"leverage_type": "key", "use_local_approximation": False}])
def test_curdkv_matches_reference(models, params):
    model, ids, plain = models
    method = get_method("curdkv", **params)
    kept, _ = kept_sets(model, method, "36", ids)
    window = method.local_window_size if method.use_local_approximation else None
    for layer, cached in enumerate(plain.layers):
        assert kept[layer] == curdkv_reference(cached.keys[0], cached.values[0], 36, method.n_sink,
                                               method.leverage_type, window)


def test_curdkv_random_leverage_is_seeded_per_layer(models):
    model, ids, _ = models
    first, _ = kept_sets(model, get_method("curdkv", use_random_leverage=True), "36", ids)
    again, _ = kept_sets(model, get_method("curdkv", use_random_leverage=True), "36", ids)
    other, _ = kept_sets(model, get_method("curdkv", use_random_leverage=True, seed=1), "36", ids)
    assert first == again and first != other


@pytest.mark.parametrize("name, params, fragment", [
    ("lagkv", {"lag_size": "0"}, "'lag_size' must be >= 1"),
    ("lagkv", {"cross_scoring": "maybe"}, "'cross_scoring' must be"),
    ("curdkv", {"leverage_type": "values"}, "'leverage_type' must be one of"),
    ("curdkv", {"local_window_size": "-1"}, "'local_window_size' must be >= 1"),
    ("keydiff", {"window": "8"}, "unknown parameter"),
])
def test_bad_parameters_are_one_line_method_errors(name, params, fragment):
    with pytest.raises(MethodError) as caught:
        get_method(name, **params)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def distinct_ids():
    """Different tokens: layer 0's pre-RoPE keys depend on the token alone, so repeats would tie exactly."""
    return (torch.randperm(250, generator=torch.Generator().manual_seed(7))[:PROMPT_LEN] + 3).tolist()


def prerope_keys_reference(attention, hidden):
    """[kv_heads, T, dim] from the layer's input hidden states through k_proj (and Qwen3's k_norm)."""
    keys = attention.k_proj(hidden).view(hidden.shape[0], -1, attention.head_dim)
    keys = attention.k_norm(keys) if hasattr(attention, "k_norm") else keys
    return keys.transpose(0, 1)


def leverage_reference(keys, sketches, budget):
    """Per head (float64): diag(X (X^T X + 0.01 I)^-1 X^T) of the centred keys' sketch X; z-normalised over all
    heads (which keeps each head's order)."""
    kept = []
    for head, sketch in zip(keys, sketches):
        sketched = (head - head.mean(0)) @ sketch
        hat = sketched @ torch.linalg.inv(sketched.T @ sketched + 0.01 * torch.eye(sketch.shape[1],
                                                                                   dtype=torch.float64)) @ sketched.T
        kept.append(top_set(hat.diagonal().tolist(), budget))
    return kept


@pytest.mark.parametrize("sketch_dimension", [48, 12])
def test_leverage_matches_reference(models, sketch_dimension):
    model, _, _ = models
    ids = distinct_ids()
    kept, _ = kept_sets(model, get_method("leverage", sketch_dimension=sketch_dimension), "40", ids)
    with torch.no_grad():
        hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        layers = model.config.num_hidden_layers
        heads, dim = model.config.num_key_value_heads, model.config.hidden_size // model.config.num_attention_heads
        sketches = torch.randn(layers, 1, heads, dim, sketch_dimension, dtype=torch.float64,
                               generator=torch.Generator().manual_seed(0)) / math.sqrt(sketch_dimension)
        for layer, decoder in enumerate(model.model.layers):
            keys = prerope_keys_reference(decoder.self_attn, decoder.input_layernorm(hidden[layer][0]))
            assert kept[layer] == leverage_reference(keys, sketches[layer, 0], 40)


def test_leverage_undoes_rope_on_the_cached_keys(models):
    """LayerInputs.keys_before_rope gives k_proj's keys (and k_norm's) back from the cached, rotated ones."""
    model, ids, plain = models
    seen = {}

    class Spy(get_method("leverage").__class__):
        def score(self, layer, n_keep):
            seen[layer.layer_idx] = layer.keys_before_rope()
            return super().score(layer, n_keep)

    prefill(model, Spy(), Budget.parse("40"), ids, len(ids), "question_in_window")
    with torch.no_grad():
        hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
        for layer, decoder in enumerate(model.model.layers):
            expected = prerope_keys_reference(decoder.self_attn, decoder.input_layernorm(hidden[layer][0]))
            torch.testing.assert_close(seen[layer][0], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("spec, fragment", [
    ({"prefill_chunk": "32"}, "cannot prefill in chunks"),
    ({"sketch_dimension": "0"}, "'sketch_dimension' must be >= 1"),
])
def test_leverage_refuses_what_it_cannot_do_in_one_line(spec, fragment):
    with pytest.raises(MethodError) as caught:
        get_method("leverage", **spec)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(MethodError, match="decoding"):
        get_method("decoding", base="leverage")


@pytest.mark.parametrize("base", ["keydiff", "lagkv:lag_size=16", "curdkv", "leverage"])
def test_each_scorer_runs_under_adakv_and_criticalkv(models, base):
    model, ids, _ = models
    name, _, params = base.partition(":")
    extra = dict(part.split("=") for part in params.split(":")) if params else {}
    out = generate(model, get_method("adakv", base=name, **extra), "24", ids, 80, 2, set(), "query_agnostic")
    heads = model.config.num_key_value_heads
    assert [sum(h) for h in out.kept_tokens_per_head] == [heads * (24 + 16)] * model.config.num_hidden_layers
    out = generate(model, get_method("criticalkv", base=name, **extra), "24", ids, 80, 2, set(), "query_agnostic")
    assert out.kept_tokens_per_layer == [24 + 16] * model.config.num_hidden_layers
