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
