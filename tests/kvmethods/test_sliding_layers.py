"""Sliding-window layers compressed too (`Method.sliding_layers` "compress", --kvbench-sliding compress): identity
at a budget above the prompt, a smaller cache than "keep" below the window, the same cache from the shared prefill,
and the refusals of methods that cannot select within a window."""

from __future__ import annotations

import pytest
import torch

from kvmethods import MethodError, get_method
from kvmethods.core.capabilities import Capability
from kvmethods.core.catalog import BUILTINS
from kvmethods.core.layout import COMPRESS, KEEP, SLIDING, refusal
from kvmethods.attention.model_probe import describe
from kvmethods.runtime.generation import generate
from kvmethods.runtime.shared_prefill import can_share_prefill, shared_prefill
from kvmethods.testing import WINDOW, family_model

PROMPT = list(range(3, 3 + 24))  # twice the tiny hybrids' window (12)
NEW = 4
EOS = {1}
METHOD_PARAMS = {"kivi": dict(group_size=16, residual=16)}
METHODS = sorted(name for name in BUILTINS if name != "hf_quantized")
SLIDING_FAMILIES = ["gemma2", "gemma3_text", "gpt_oss", "cohere2", "mistral"]

_models: dict[str, torch.nn.Module] = {}


def model_of(family: str):
    if family not in _models:  # mistral with a window: every layer slides
        _models[family] = family_model(family, **({"sliding_window": WINDOW} if family == "mistral" else {}))
    return _models[family]


def method_of(name: str, policy: str = COMPRESS):
    return get_method(name, **METHOD_PARAMS.get(name, {})).with_sliding_layers(policy)


def decoded(out) -> list[int]:
    return out.tokens + ([out.stop_token] if out.stop_token is not None else [])


def per_token_bytes(model) -> int:
    return 2 * model.config.num_key_value_heads * model.config.head_dim * 4  # K and V of one token, float32


@pytest.mark.parametrize("family", SLIDING_FAMILIES)
def test_compressed_sliding_layers_at_a_full_budget_give_the_models_own_generate(family):
    """Every method the family supports with sliding layers compressed, at a budget above the prompt: the tokens
    and log-probs of the model's own uncompressed generate, alone and from the shared prefill."""
    model = model_of(family)
    assert SLIDING in {layer.kind for layer in describe(model).layers}
    out = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False, output_scores=True,
                         return_dict_in_generate=True)
    tokens = out.sequences[0, len(PROMPT):].tolist()
    logprobs = torch.log_softmax(torch.stack(out.scores)[:, 0].float(), -1)
    tried = 0
    for name in METHODS:
        method = method_of(name)
        if Capability.OWN_STORAGE & method.capabilities or refusal(describe(model), method.capabilities, COMPRESS):
            continue
        tried += 1
        got = generate(model, method, "64", PROMPT, 16, NEW, EOS, "query_agnostic", return_logprobs=True)
        assert decoded(got) == tokens, (family, name)
        torch.testing.assert_close(got.logprobs, logprobs, atol=1e-4, rtol=0)
        if can_share_prefill(method):
            state = shared_prefill(model, [(method, "64")], PROMPT, 16, "query_agnostic").selections[0]
            shared = generate(model, method, None, PROMPT, 16, NEW, EOS, "query_agnostic", prefilled=state)
            assert decoded(shared) == tokens, (family, name, "shared")
    assert tried >= 8


@pytest.mark.parametrize("family", SLIDING_FAMILIES)
@pytest.mark.parametrize("name", ["snapkv", "streamingllm", "tova", "pyramidkv"])
def test_a_budget_below_the_window_compresses_sliding_layers_to_it(family, name):
    """Budget 4 < the window (12): with "compress" each sliding layer holds 4 tokens per head where "keep" holds
    its window (11), the global layers the same 4; the memory figures say so (kv_bytes_window), the output differs
    from keep's, and the shared prefill's cache and tokens equal the single-prompt road's."""
    model = model_of(family)
    layout = describe(model)
    runs = {policy: generate(model, method_of(name, policy), "4", PROMPT, len(PROMPT), NEW, set(),
                             "question_in_window", return_logprobs=True) for policy in (KEEP, COMPRESS)}
    keep, compress = runs[KEEP], runs[COMPRESS]
    sliding = [i for i, layer in enumerate(layout.layers) if layer.kind == SLIDING]
    budgets = get_method(name).layer_budgets(4, len(layout.layers), len(PROMPT))
    assert [keep.kept_tokens_per_layer[i] for i in sliding] == [WINDOW - 1] * len(sliding)
    assert [compress.kept_tokens_per_layer[i] for i in sliding] == [budgets[i] for i in sliding]
    assert compress.kv_bytes_window == sum(budgets[i] for i in sliding) * per_token_bytes(model)
    assert keep.kv_bytes_window == len(sliding) * (WINDOW - 1) * per_token_bytes(model)
    assert compress.kv_bytes_after - compress.kv_bytes_window == keep.kv_bytes_after - keep.kv_bytes_window
    assert not torch.allclose(keep.logprobs[1:], compress.logprobs[1:])  # [0]: the prompt forward, before any cut
    method = method_of(name)
    state = shared_prefill(model, [(method, "4")], PROMPT, len(PROMPT), "question_in_window").selections[0]
    shared = generate(model, method, None, PROMPT, len(PROMPT), NEW, set(), "question_in_window", prefilled=state,
                      return_logprobs=True)
    assert shared.tokens == compress.tokens
    torch.testing.assert_close(shared.logprobs, compress.logprobs, atol=1e-5, rtol=0)


def test_compressed_windows_mask_each_head_by_its_own_positions():
    """After compression the heads of a sliding layer hold different positions; decoding past the window drops
    every kept prompt token (none is within a query's window any more) and the layer holds window - 1 tokens."""
    from kvmethods.runtime.generation import prefill, decode_greedy
    from kvmethods.storage.window_layer import WindowLayer

    model = model_of("gemma2")
    state = prefill(model, method_of("snapkv"), "4", PROMPT, len(PROMPT), "question_in_window")
    window = next(layer for layer in state.cache.layers if isinstance(layer, WindowLayer))
    assert window.positions.shape[-1] == 4 and int(window.positions.max()) == len(PROMPT) - 1
    decode_greedy(model, state, WINDOW + 2, set())
    assert window.keys.shape[-2] == WINDOW - 1
    assert int(window.positions.min()) >= state.next_position - (WINDOW - 1)


@pytest.mark.parametrize("name", ["adakv", "rkv", "decoding", "merge", "simlayerkv"])
def test_methods_that_cannot_select_within_a_window_are_refused_in_one_line(name):
    model = model_of("gemma2")
    with pytest.raises(MethodError) as refused:
        generate(model, method_of(name), "4", PROMPT, 16, NEW, set(), "query_agnostic")
    message = str(refused.value)
    assert "\n" not in message and "sliding=compress" in message and "'gemma2'" in message
    generate(model, method_of(name, KEEP), "4", PROMPT, 16, NEW, set(), "query_agnostic")  # keep: it runs


def test_a_bad_policy_is_one_line():
    with pytest.raises(MethodError, match="'squeeze' is not one of keep, compress"):
        get_method("snapkv").with_sliding_layers("squeeze")


@pytest.mark.parametrize("name, budget", [("kivi", "8"), ("snapkv+kivi", "8"), ("think+kivi", "8")])
def test_quantizers_keep_a_sliding_layer_as_its_window_in_full_precision(name, budget):
    """KIVI (alone or composed) and ThinK store the global layers their own way and a sliding layer as its window,
    in full precision (docs/models.md says why), whose bytes the memory figures count in full: kv_bytes_window is
    window - 1 tokens at the model's dtype, inside kv_bytes_after."""
    from kvmethods.storage.window_layer import WindowLayer
    from kvmethods.runtime.generation import prefill

    model = model_of("gemma2")
    method = get_method(name, group_size=16, residual=16)
    state = prefill(model, method, budget, PROMPT, len(PROMPT), "question_in_window")
    kinds = [layer.kind for layer in describe(model).layers]
    assert [isinstance(layer, WindowLayer) for layer in state.cache.layers] == [kind == SLIDING for kind in kinds]
    out = generate(model, method, budget, PROMPT, len(PROMPT), NEW, set(), "question_in_window")
    assert out.kv_bytes_window == (WINDOW - 1) * per_token_bytes(model) < out.kv_bytes_after


@pytest.mark.parametrize("family, policy, budget, kept, distance", [
    # gemma2 (1 sliding, 1 global layer), 24 tokens: the allowance is budget x 2 layers x 24 tokens
    ("gemma2", KEEP, "m0.5", [WINDOW - 1, 13], 0),  # the window (11) leaves 24 - 11 = 13 to the global layer
    ("gemma2", KEEP, "m0.25", [WINDOW - 1, 1], 0),  # the window takes 11 of 12: the global layer keeps 1
    ("gemma2", KEEP, "m0.9", [WINDOW - 1, 23], None),  # under: 23 is the most a compressing budget keeps
    ("gemma2", COMPRESS, "m0.25", [6, 6], 0),  # compressed windows count their tokens like the global layers
    ("gemma2", COMPRESS, "m0.5", [WINDOW - 1, 13], 0),  # a window below its share stays the window
    ("mistral", KEEP, "m0.25", [WINDOW - 1] * 2, 2 * (WINDOW - 1) - 12),  # windows alone exceed it: over, said
    ("mistral", COMPRESS, "m0.25", [6, 6], 0),
])
def test_byte_budgets_count_what_sliding_layers_really_hold(family, policy, budget, kept, distance):
    """A byte budget's tokens per layer come from what every layer holds: a window kept whatever the budget
    (at most window - 1 tokens), a compressed one at most the budget's tokens; the global layers get the rest of
    the allowance (fraction x the full cache of every layer), and a record says how far over it the windows alone
    are. The shared prefill plans the same."""
    from kvmethods.runtime.generation import record_fields

    model = model_of(family)
    method = method_of("snapkv", policy)
    out = generate(model, method, budget, PROMPT, len(PROMPT), 2, set(), "question_in_window")
    assert out.kept_tokens_per_layer == kept
    over = record_fields(out)["kv_budget_distance_bytes"]
    if distance is None:
        assert over < 0
    else:
        assert over == distance * per_token_bytes(model)
    state = shared_prefill(model, [(method, budget)], PROMPT, len(PROMPT), "question_in_window").selections[0]
    assert generate(model, method, None, PROMPT, len(PROMPT), 2, set(), "question_in_window",
                    prefilled=state).kept_tokens_per_layer == kept
