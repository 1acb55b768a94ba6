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
from kvmethods.runtime.generation import prefill
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
