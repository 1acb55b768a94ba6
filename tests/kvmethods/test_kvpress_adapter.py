"""The kvpress adapter, and native methods against kvpress presses with equal settings (kvpress extra only).

Skipped unless kvpress is installed (CI runs it in a second environment: .ci/run). Kept positions are read
back from what each side leaves: for native methods the kept indices, for kvpress' scorer presses the
rows of the compressed cache matched to the full cache's rows, for head-wise presses the complement of
the keys kvpress masks. Divergences found and their causes are listed in kvmethods/README.md.
"""

import pytest
import torch

kvpress = pytest.importorskip("kvpress")

from kvmethods import Budget, MethodError, get_method  # noqa: E402
from kvmethods.attention.families import decoder_layers  # noqa: E402
from kvmethods.runtime.generation import generate, prefill  # noqa: E402
from kvmethods.testing import tiny_model  # noqa: E402
from model_helpers import FAMILIES, one_thread  # noqa: E402, F401 (one_thread applies here)

PROMPT_LEN = 96


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return tiny_model(request.param, seed=1, dtype=torch.float64, qk_scale=10.0)


def prompt(vocab):
    return torch.randint(3, vocab, (PROMPT_LEN,), generator=torch.Generator().manual_seed(7)).tolist()


def native_kept(model, method, budget, ids):
    state = prefill(model, method, Budget.parse(budget), ids, len(ids), "question_in_window")
    out = []
    for selection in state.kept_indices:
        if selection.dtype == torch.bool:
            out.append([set(torch.nonzero(head).flatten().tolist()) for head in selection[0]])
        else:
            out.append([set(head.tolist()) for head in selection[0]])
    return out


def press_kept(model, method, budget, ids):
    full = prefill(model, get_method("full"), Budget.parse("100000"), ids, len(ids), "question_in_window").cache
    state = prefill(model, method, Budget.parse(budget), ids, len(ids), "question_in_window")
    out = []
    for layer, (compressed, reference) in enumerate(zip(state.cache.layers, full.layers)):
        masked = getattr(decoder_layers(model)[layer].self_attn, "masked_key_indices", None)
        heads = []
        for head in range(reference.keys.shape[1]):
            if masked is not None:  # head-wise press: the full cache stays, minus what attention is told to skip
                hidden = {int(s) for h, s in zip(masked[1], masked[2]) if int(h) == head}
                heads.append(set(range(len(ids))) - hidden)
            else:  # scorer press: kept rows, in score order, matched to the full cache's rows
                distance = torch.cdist(compressed.keys[0, head], reference.keys[0, head])
                heads.append(set(distance.argmin(-1).tolist()))
        out.append(heads)
    return out


EQUAL_SETTINGS = [
    (("snapkv", {"window": 8, "kernel": 5}), ("kvpress:SnapKVPress", {"window_size": 8, "kernel_size": 5})),
    (("streamingllm", {"sinks": 4}), ("kvpress:StreamingLLMPress", {"n_sink": 4})),
    (("tova", {}), ("kvpress:TOVAPress", {})),
    (("knorm", {}), ("kvpress:KnormPress", {})),
    (("expected_attention", {}), ("kvpress:ExpectedAttentionPress", {})),
    (("criticalkv", {"window": 8, "kernel": 5}),
     ("kvpress:CriticalKVPress", {"press": "SnapKVPress", "press.window_size": 8, "press.kernel_size": 5})),
    (("adakv", {"window": 8, "kernel": 5}),
     ("kvpress:AdaKVPress", {"press": "SnapKVPress", "press.window_size": 8, "press.kernel_size": 5})),
    (("adakv", {"base": "expected_attention"}), ("kvpress:AdaKVPress", {"press": "ExpectedAttentionPress"})),
    (("keydiff", {}), ("kvpress:KeyDiffPress", {})),
    (("lagkv", {"lag_size": 16}), ("kvpress:LagKVPress", {"lag_size": 16})),
    (("lagkv", {"lag_size": 8, "n_sink": 2, "cross_scoring": True}),
     ("kvpress:LagKVPress", {"lag_size": 8, "n_sink": 2, "cross_scoring": True})),
    (("lagkv", {}), ("kvpress:LagKVPress", {})),  # 96 tokens < n_sink + 2 x 128: sinks + the most recent
    (("curdkv", {}), ("kvpress:CURPress", {})),
    (("noncausal_attention", {}), ("kvpress:NonCausalAttnPress", {})),  # one chunk, padded: 96 tokens < 256
    (("noncausal_attention", {"chunk_size": 32}), ("kvpress:NonCausalAttnPress", {"chunk_size": 32})),
    (("noncausal_attention", {"chunk_size": 40}), ("kvpress:NonCausalAttnPress", {"chunk_size": 40})),
    (("curdkv", {"leverage_type": "kv_avg", "local_window_size": 7, "n_sink": 2}),
     ("kvpress:CURPress", {"leverage_type": "kv_avg", "local_window_size": 7, "num_sinks": 2})),
    (("curdkv", {"leverage_type": "value", "use_local_approximation": False}),
     ("kvpress:CURPress", {"leverage_type": "value", "use_local_approximation": False})),
]


@pytest.mark.parametrize("native, press", EQUAL_SETTINGS, ids=[n[0] + "-" + str(n[1]) for n, _ in EQUAL_SETTINGS])
@pytest.mark.parametrize("budget", ["r0.5", "40"])
def test_native_methods_keep_what_kvpress_keeps(model, native, press, budget):
    if press[0] == "kvpress:CriticalKVPress" and model.config.model_type == "qwen2":
        pytest.xfail("kvpress' CriticalKVPress reads config.head_dim, which Qwen2Config does not define")
    ids = prompt(model.config.vocab_size)
    ours = native_kept(model, get_method(native[0], **native[1]), budget, ids)
    theirs = press_kept(model, get_method(press[0], **press[1]), budget, ids)
    assert ours == theirs


def distinct_prompt(vocab):
    """PROMPT_LEN different tokens: layer 0's pre-RoPE keys depend on the token alone, so a repeated token's
    keys tie exactly under leverage, and kvpress's topk breaks ties its own way."""
    return (torch.randperm(vocab - 3, generator=torch.Generator().manual_seed(7))[:PROMPT_LEN] + 3).tolist()


@pytest.mark.parametrize("sketch_dimension", [48, 12])
@pytest.mark.parametrize("budget", ["r0.5", "40"])
def test_leverage_keeps_what_leveragescorepress_keeps(model, sketch_dimension, budget):
    ids = distinct_prompt(model.config.vocab_size)
    ours = native_kept(model, get_method("leverage", sketch_dimension=sketch_dimension), budget, ids)
    torch.manual_seed(0)  # LeverageScorePress draws its sketches from the global generator, layer after layer
    theirs = press_kept(model, get_method("kvpress:LeverageScorePress", sketch_dimension=sketch_dimension), budget, ids)
    assert ours == theirs


@pytest.mark.parametrize("family", FAMILIES)
def test_kvzip_keeps_what_kvzippress_keeps(family):
    from pytest_kvbench.engine.models import DEFAULT_MODEL_DIR

    # KVzipPress loads the tokenizer from name_or_path: lend the random model the embedded model's
    model = tiny_model(family, seed=1, qk_scale=10.0, vocab_size=4096)  # KVzipPress fails on float64
    model.config.name_or_path = str(DEFAULT_MODEL_DIR)
    ids = prompt(model.config.vocab_size)
    ours = native_kept(model, get_method("adakv", base="kvzip", alpha=0, chunk_size=40), "r0.5", ids)
    theirs = press_kept(model, get_method("kvpress:KVzipPress", layerwise=True, chunk_size=40), "r0.5", ids)
    assert ours == theirs
    # KVzipPress's default shares the budget over all layers as well
    ours = native_kept(model, get_method("adakv", base="kvzip", alpha=0, across_layers=True, chunk_size=40),
                       "r0.5", ids)
    theirs = press_kept(model, get_method("kvpress:KVzipPress", chunk_size=40), "r0.5", ids)
    assert ours == theirs


def test_token_budgets_keep_exactly_that_many_and_masking_presses_save_nothing(model):
    ids = prompt(model.config.vocab_size)
    for budget in ["40", "47", "1"]:
        out = generate(model, get_method("kvpress:KnormPress"), budget, ids, len(ids), 2, set(), "question_in_window")
        assert out.kept_tokens_per_layer == [int(budget)] * model.config.num_hidden_layers and not out.masked_only
    out = generate(model, get_method("kvpress:AdaKVPress", press="KnormPress"), "40", ids, len(ids), 2, set(),
                   "question_in_window")
    heads = model.config.num_key_value_heads
    assert out.masked_only and [sum(h) for h in out.kept_tokens_per_head] == [40 * heads] * len(out.kept_tokens_per_head)
    assert out.kv_bytes_physical == out.kv_bytes_before > out.kv_bytes_logical  # the full cache stays in memory


@pytest.mark.parametrize("name, params, fragment", [
    ("kvpress:SnapKVPres", {}, "has no press 'SnapKVPres'; valid presses: AdaKVPress"),
    ("kvpress:AdaKVPress", {}, "AdaKVPress wraps another press: add press=<PressName>"),
    ("kvpress:AdaKVPress", {"press": "NoSuchPress"}, "has no press 'NoSuchPress'"),
    ("kvpress:AdaKVPress", {"press": "StreamingLLMPress", "press.n_snk": "4"}, "parameter 'n_snk' of StreamingLLMPress"),
    ("kvpress:AdaKVPress", {"press": "AdaKVPress", "press.press": "SnapKVPress"}, "is refused by kvpress"),
    ("kvpress:SnapKVPress", {"window_size": "wide"}, "'window_size' must be int"),
    ("kvpress:SnapKVPress", {"compression_ratio": "0.5"}, "is set from the budget"),
    ("kvpress:SnapKVPress", {"inner.window_size": "3"}, "names no inner press"),
    ("kvpress:", {}, "name the press"),
])
def test_bad_press_specs_are_one_line_method_errors(name, params, fragment):
    with pytest.raises(MethodError) as caught:
        get_method(name, **params)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)




def test_press_parameters_are_coerced_by_the_press_signature_and_recorded():
    method = get_method("kvpress:ChunkKVPress", press="SnapKVPress", chunk_length="10", **{"press.window_size": "16"})
    assert method.press.chunk_length == 10 and method.press.press.window_size == 16
    assert method.params() == {"chunk_length": "10", "press": "SnapKVPress", "press.window_size": "16",
                               "press_config": repr(method.press)}
    assert get_method("kvpress:RandomPress", seed="3").press.seed == 3  # Optional[int]
    assert get_method("kvpress:ExpectedAttentionPress", use_vnorm="false").press.use_vnorm is False
