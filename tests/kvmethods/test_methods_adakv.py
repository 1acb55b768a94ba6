"""adakv and its ragged cache, on tiny Llama/Mistral/Qwen2/Qwen3 models built from configs.

What must hold for its numbers to be trusted: with equal scores in every head it is its base method; the
per-head budgets share exactly heads x budget tokens with the safeguard floor; attention over the ragged
cache equals attention over the same kept positions done by masking a full forward (eager, float64); and
the bytes held are the sum over heads of what they keep, not heads x the longest head.
"""

import pytest
import torch

from kvmethods import MethodError, get_method
from kvmethods.wrappers.adakv import head_adaptive_mask
from kvmethods.runtime.generation import generate, prefill
from kvmethods.storage.ragged import KERNEL, RaggedLayer
from kvmethods.testing import tiny_model
from model_helpers import FAMILIES, one_thread, sdpa_and_eager  # noqa: F401 (one_thread applies here)

PROMPT = torch.randint(3, 256, (64,), generator=torch.Generator().manual_seed(11)).tolist()


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return tiny_model(request.param, seed=3, qk_scale=4.0)


def kept_sets(selection):
    """Per KV head, the set of kept positions, from indices [1, H, n] or a bool mask [1, H, T]."""
    if selection.dtype == torch.bool:
        return [set(torch.nonzero(head).flatten().tolist()) for head in selection[0]]
    return [set(head.tolist()) for head in selection[0]]


@pytest.mark.parametrize("budget", ["12", "r0.5"])
def test_equal_scores_in_every_head_give_the_base_method(model, budget):
    # tova averages its scores over heads, so every head ranks positions the same way
    base = prefill(model, get_method("tova"), budget, PROMPT, len(PROMPT), "question_in_window")
    ada = prefill(model, get_method("adakv", base="tova"), budget, PROMPT, len(PROMPT), "question_in_window")
    for dense, ragged in zip(base.kept_indices, ada.kept_indices):
        assert kept_sets(dense) == kept_sets(ragged)
    assert all(isinstance(layer, RaggedLayer) for layer in ada.cache.layers)
    torch.testing.assert_close(ada.next_logits, base.next_logits, rtol=1e-5, atol=1e-5)
    dense_out = generate(model, get_method("tova"), budget, PROMPT, 40, 6, set(), "query_agnostic")
    ragged_out = generate(model, get_method("adakv", base="tova"), budget, PROMPT, 40, 6, set(), "query_agnostic")
    assert ragged_out.tokens == dense_out.tokens
    assert ragged_out.kept_tokens_per_layer == dense_out.kept_tokens_per_layer



@pytest.mark.parametrize("budget", ["12", "m0.25"])
def test_a_floor_of_the_whole_budget_gives_the_base_method_whatever_the_heads_score(model, budget):
    # snapkv's heads rank positions differently (GQA groups of 2 here); alpha=1 leaves nothing to share,
    # so the ragged cache must hold exactly snapkv's positions per head and decode the same tokens
    dense = prefill(model, get_method("snapkv", window=4), budget, PROMPT, len(PROMPT), "question_in_window")
    ragged = prefill(model, get_method("adakv", window=4, alpha=1.0), budget, PROMPT, len(PROMPT),
                     "question_in_window")
    assert any(len({frozenset(h) for h in kept_sets(layer)}) > 1 for layer in dense.kept_indices), \
        "every head kept the same positions: the test would prove nothing"
    for base_layer, ada_layer in zip(dense.kept_indices, ragged.kept_indices):
        assert kept_sets(base_layer) == kept_sets(ada_layer)
    dense_out = generate(model, get_method("snapkv", window=4), budget, PROMPT, len(PROMPT), 6, set(),
                         "question_in_window", return_logprobs=True)
    ragged_out = generate(model, get_method("adakv", window=4, alpha=1.0), budget, PROMPT, len(PROMPT), 6, set(),
                          "question_in_window", return_logprobs=True)
    assert ragged_out.tokens == dense_out.tokens
    torch.testing.assert_close(ragged_out.logprobs, dense_out.logprobs, rtol=1e-5, atol=1e-5)

def test_shared_budget_and_safeguard_floor():
    scores = torch.rand(1, 4, 50, generator=torch.Generator().manual_seed(0))
    scores[:, 0] *= 10  # head 0 dominates the shared top-k
    mask = head_adaptive_mask(scores, 10, 0.2)
    counts = mask.sum(-1)[0].tolist()
    assert sum(counts) == 40 and counts[0] > 10 and min(counts) >= 2
    for head in range(4):  # each head's own top 2 are kept whatever the other heads score
        assert set(scores[0, head].topk(2).indices.tolist()) <= set(torch.nonzero(mask[0, head]).flatten().tolist())
    kept = scores.masked_fill(~mask, float("-inf")).flatten()
    rest = scores.flatten()[~mask.flatten()]
    floor_kept = {h * 50 + int(i) for h in range(4) for i in scores[0, h].topk(2).indices}
    others = [float(kept[i]) for i in range(200) if mask.flatten()[i] and i not in floor_kept]
    assert min(others) >= float(rest.max())  # beyond the floor, the global top-k decides
    assert head_adaptive_mask(scores, 10, 1.0).sum(-1).tolist() == [[10, 10, 10, 10]]
    assert head_adaptive_mask(scores, 10, 0.0).sum(-1)[0, 1:].min() == 0  # no floor: a head may lose all


def per_head_masked_logits(eager, ids, selections, first_free):
    """Logits of a full eager forward where, in each layer, row i >= first_free sees only its KV head's kept
    prompt positions (< first_free) plus the rows from first_free to i. Rows before first_free are the
    uncompressed prefill."""
    T, n_heads = len(ids), eager.config.num_attention_heads
    hooks = []
    for layer_idx, layer in enumerate(eager.model.layers):
        kept = kept_sets(selections[layer_idx])
        groups = n_heads // len(kept)
        mask = torch.full((1, n_heads, T, T), torch.finfo(torch.float64).min, dtype=torch.float64)
        for head in range(n_heads):
            for i in range(T):
                for j in range(i + 1):
                    if i < first_free or j >= first_free or j in kept[head // groups]:
                        mask[0, head, i, j] = 0.0

        def set_mask(module, args, kwargs, mask=mask):
            kwargs["attention_mask"] = mask
            return args, kwargs

        hooks.append(layer.self_attn.register_forward_pre_hook(set_mask, with_kwargs=True))
    try:
        with torch.no_grad():
            return eager(torch.tensor([ids])).logits[0]
    finally:
        for hook in hooks:
            hook.remove()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("protocol", ["question_in_window", "query_agnostic"])
def test_attention_over_the_ragged_cache_equals_masked_attention(family, protocol):
    sdpa, eager = sdpa_and_eager(family, seed=5, qk_scale=4.0)
    context_len = len(PROMPT) if protocol == "question_in_window" else 48
    method = get_method("adakv", base="snapkv", window=4)
    out = generate(sdpa, method, "12", PROMPT, context_len, 4, set(), protocol, return_logprobs=True)
    state = prefill(sdpa, method, "12", PROMPT, context_len, protocol)
    counts = [layer.kept_per_head for layer in state.cache.layers]
    assert any(len(set(c)) > 1 for c in counts), f"heads kept equal counts {counts}: the test would prove nothing"
    ids = PROMPT + out.tokens[:-1]
    logits = per_head_masked_logits(eager, ids, state.kept_indices, context_len)[len(PROMPT) - 1:]
    torch.testing.assert_close(out.logprobs, torch.log_softmax(logits.float(), -1), rtol=1e-6, atol=1e-6)
    # the test can fail: the same counts kept as a dense top-k per head give other distributions
    dense = generate(sdpa, get_method("snapkv", window=4), "12", PROMPT, context_len, 4, set(), protocol,
                     return_logprobs=True)
    assert not torch.allclose(dense.logprobs[1:], out.logprobs[1:], rtol=1e-4, atol=1e-4)


def test_physical_bytes_are_the_sum_over_heads(model):
    out = generate(model, get_method("adakv", window=4), "r0.5", PROMPT, 48, 3, set(), "query_agnostic")
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    head_dim = getattr(model.config, "head_dim", None) or head_dim
    token_bytes = 2 * head_dim * 4  # keys + values of one head, float32
    total = sum(sum(heads) for heads in out.kept_tokens_per_head)
    assert out.kv_bytes_physical == out.kv_bytes_logical == out.kv_bytes_after == token_bytes * total
    padded = sum(max(heads) * len(heads) for heads in out.kept_tokens_per_head) * token_bytes
    assert out.kv_bytes_physical < padded  # heads do differ, and nothing is padded to the longest one
    heads = model.config.num_key_value_heads
    assert [sum(h) for h in out.kept_tokens_per_head] == [heads * (24 + 16)] * model.config.num_hidden_layers
    assert out.kept_tokens_per_layer == [24 + 16] * model.config.num_hidden_layers
    assert out.ragged_kernel == KERNEL
    assert generate(model, get_method("snapkv"), "r0.5", PROMPT, 48, 3, set(), "query_agnostic").ragged_kernel is None


def test_parameters_go_to_the_base_and_into_the_record():
    method = get_method("adakv", base="pyramidkv", window="8", alpha="0.3")
    assert method.params() == {"base": "pyramidkv", "alpha": 0.3, "across_layers": False,
                               "base_params": {"window": 8, "kernel": 7, "pooling": "avgpool", "beta": 20.0}}
    assert method.layer_budgets(64, 4, 200) == get_method("pyramidkv", window=8).layer_budgets(64, 4, 200)
    assert get_method("adakv").params()["base"] == "snapkv"


@pytest.mark.parametrize("params, fragment", [
    ({"base": "streamingllm"}, "base 'streamingllm' cannot be wrapped (it selects positions without per-layer scores)"),
    ({"base": "full"}, "base 'full' cannot be wrapped (it keeps everything)"),
    ({"base": "adakv"}, "cannot wrap itself"),
    ({"base": "snapk"}, "unknown method 'snapk'"),
    ({"alpha": "1.5"}, "'alpha' must be in [0, 1]"),
    ({"windw": "8"}, "snapkv: unknown parameter 'windw'"),
])
def test_bad_adakv_specs_are_one_line_method_errors(params, fragment):
    with pytest.raises(MethodError) as caught:
        get_method("adakv", **params)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)
