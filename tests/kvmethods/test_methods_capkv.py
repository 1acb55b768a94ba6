"""capkv on tiny models: what must hold beyond agreeing with CapPress (test_kvpress_wrappers.py)."""

import pytest
import torch

from kvmethods import MethodError, get_method
from kvmethods.runtime.generation import generate, prefill
from kvmethods.testing import tiny_model
from model_helpers import one_thread  # noqa: F401 (one_thread applies here)

PROMPT = torch.randint(3, 256, (64,), generator=torch.Generator().manual_seed(11)).tolist()


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(request):
    return tiny_model(request.param, seed=3, qk_scale=4.0)


def test_capkv_keeps_its_sinks_and_exactly_the_budget(model):
    state = prefill(model, get_method("capkv", n_sink=3), "10", PROMPT, len(PROMPT), "query_agnostic")
    for kept in state.kept_indices:
        assert kept.shape[-1] == 10 and (kept[0, :, :3] == torch.arange(3)).all()
    out = generate(model, get_method("capkv"), "r0.5", PROMPT, len(PROMPT), 3, set(), "query_agnostic")
    assert out.kept_tokens_per_layer == [32] * model.config.num_hidden_layers


def test_tau_changes_what_capkv_keeps(model):
    sharp = prefill(model, get_method("capkv", tau=20.0), "16", PROMPT, len(PROMPT), "query_agnostic")
    flat = prefill(model, get_method("capkv", tau=0.0), "16", PROMPT, len(PROMPT), "query_agnostic")
    assert any(not torch.equal(a, b) for a, b in zip(sharp.kept_indices, flat.kept_indices))


@pytest.mark.parametrize("params, message", [({"tau": "-1"}, "'tau' must be >= 0"),
                                             ({"n_future_positions": "0"}, "'n_future_positions' must be >= 1")])
def test_bad_parameters_are_one_line(params, message):
    with pytest.raises(MethodError) as refused:
        get_method("capkv", **params)
    assert message in str(refused.value) and "\n" not in str(refused.value)
