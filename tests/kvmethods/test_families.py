"""Every decoder family of kvmethods/testing.py (FAMILIES): its description, identity at a full budget, windows kept
exactly, and every built-in method either compressing it or refused in one line naming family, method and why."""

from __future__ import annotations

import pytest
import torch

from kvmethods import MethodError, get_method
from kvmethods.core.capabilities import Capability
from kvmethods.core.catalog import BUILTINS
from kvmethods.core.layout import CAPTURED, GLOBAL, LINEAR, PROJECTION, SLIDING, refusal
from kvmethods.attention.model_probe import describe
from kvmethods.runtime.generation import generate
from kvmethods.runtime.shared_prefill import can_share_prefill, shared_prefill
from kvmethods.testing import FAMILIES, WINDOW, family_model

PROMPT = list(range(3, 3 + 24))  # longer than the tiny hybrids' window (12)
NEW = 4
# Built-ins by spec: parameters fit the tiny models (head_dim 16: KIVI's groups), hf_quantized needs quanto.
# simlayerkv: every layer lazy (a random model's last query looks everywhere), so it compresses like the others.
METHOD_PARAMS = {"kivi": dict(group_size=16, residual=16), "simlayerkv": dict(threshold=0.0)}
METHODS = sorted(name for name in BUILTINS if name != "hf_quantized")
LOSSY = Capability.OWN_STORAGE  # quantizers and channel pruning change every kept token: no identity

_models: dict[str, torch.nn.Module] = {}


def model_of(family: str):
    if family not in _models:
        _models[family] = family_model(family)
    return _models[family]


def method_of(name: str):
    return get_method(name, **METHOD_PARAMS.get(name, {}))


EOS = {1}  # the tiny models' eos_token_id: generate() stops there as the model's own generate does


def decoded(out) -> list[int]:
    """The tokens generate() decoded, with the eos that stopped it (the model's own generate returns it)."""
    return out.tokens + ([out.stop_token] if out.stop_token is not None else [])


def reference(model):
    out = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False, output_scores=True,
                         return_dict_in_generate=True)
    return out.sequences[0, len(PROMPT):].tolist(), torch.log_softmax(torch.stack(out.scores)[:, 0].float(), -1)


EXPECTED = {  # what the probe must find, per family: (layer kinds, query source of the cached layers)
    "phi3": ([GLOBAL, GLOBAL], CAPTURED),  # fused qkv_proj
    "glm4": ([GLOBAL, GLOBAL], CAPTURED),  # partial, interleaved RoPE
    "olmo2": ([GLOBAL, GLOBAL], CAPTURED),  # q_norm over the whole projection
    "gemma2": ([SLIDING, GLOBAL], PROJECTION),
    "gemma3_text": ([SLIDING, GLOBAL], PROJECTION),
    "gpt_oss": ([SLIDING, GLOBAL], CAPTURED),
    "cohere2": ([SLIDING, GLOBAL], None),  # interleaved RoPE on sliding layers, none on global ones
    "qwen3_next": ([LINEAR, GLOBAL], CAPTURED),  # gated q_proj
    "deepseek_v3": ([GLOBAL, GLOBAL], CAPTURED),
    "llama": ([GLOBAL, GLOBAL], PROJECTION),
    "qwen3": ([GLOBAL, GLOBAL], PROJECTION),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_probe_describes_each_family_from_its_modules(family):
    layout = describe(model_of(family))
    kinds, source = EXPECTED.get(family, ([GLOBAL, GLOBAL], PROJECTION))
    assert [layer.kind for layer in layout.layers] == kinds
    if source is not None:
        assert {layer.queries for layer in layout.layers if layer.has_cache} == {source}
    assert [layer.window for layer in layout.layers if layer.kind == SLIDING] == [WINDOW] * kinds.count(SLIDING)
    assert [bool(layer.sinks) for layer in layout.layers] == [family == "gpt_oss"] * 2
    if family == "smollm3":  # no_rope_layers [1, 0]: the second layer rotates nothing
        assert [layer.rope for layer in layout.layers] == [True, False]
    if family == "cohere2":
        assert [(layer.queries, layer.rope) for layer in layout.layers] == [(CAPTURED, True), (PROJECTION, False)]
    assert [layer.latent for layer in layout.layers] == [family == "deepseek_v3"] * 2


def _refused(model, method) -> str | None:
    return refusal(describe(model), method.capabilities)




@pytest.mark.parametrize("family", FAMILIES)
def test_a_full_budget_gives_the_models_own_generate(family):
    """Every method the family supports, at a budget above the prompt, decodes the tokens and log-probs of the
    model's own uncompressed generate (alone, and from the shared prefill)."""
    model = model_of(family)
    tokens, logprobs = reference(model)
    for name in METHODS:
        method = method_of(name)
        if LOSSY & method.capabilities or _refused(model, method):
            continue
        protocol, context = "query_agnostic", 16
        out = generate(model, method, "64", PROMPT, context, NEW, EOS, protocol, return_logprobs=True)
        assert decoded(out) == tokens, (family, name)
        torch.testing.assert_close(out.logprobs, logprobs, atol=1e-4, rtol=0)
        if can_share_prefill(method):
            state = shared_prefill(model, [(method, "64")], PROMPT, context, protocol).selections[0]
            shared = generate(model, method, None, PROMPT, context, NEW, EOS, protocol, prefilled=state)
            assert decoded(shared) == tokens, (family, name, "shared")


class _WindowOnly(type(get_method("snapkv"))):
    """SnapKV that compresses nothing but what the family's sliding layers must drop."""

    def layer_budgets(self, budget, n_layers, prompt_len):
        return [1] * n_layers


@pytest.mark.parametrize("family", ["gemma2", "gemma3_text", "gpt_oss", "cohere2"])
@pytest.mark.parametrize("protocol, context", [("question_in_window", len(PROMPT)), ("query_agnostic", 16)])
def test_sliding_layers_keep_their_window_exactly(family, protocol, context):
    """Global layers compressed to 1 token per head would change the output; sliding layers kept as their
    window with position-exact masks do not: tokens equal the model's own generate when only the windows act
    (global layers at the full prompt), and sliding layers hold window - 1 tokens."""
    model = model_of(family)
    layout = describe(model)
    tokens, logprobs = reference(model)

    class Method(_WindowOnly):
        def layer_budgets(self, budget, n_layers, prompt_len):
            return [1 if layer.kind == SLIDING else prompt_len for layer in layout.layers]

    out = generate(model, Method(), "8", PROMPT, context, NEW, EOS, protocol, return_logprobs=True)
    assert decoded(out) == tokens
    torch.testing.assert_close(out.logprobs, logprobs, atol=1e-4, rtol=0)
    windows = [kept for kept, layer in zip(out.kept_tokens_per_layer, layout.layers) if layer.kind == SLIDING]
    assert windows == [WINDOW - 1] * len(windows)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_builtin_method_compresses_the_family_or_is_refused_in_one_line(family):
    model = model_of(family)
    layout = describe(model)
    for name in METHODS:
        method = method_of(name)
        reason = _refused(model, method)
        if reason is not None:
            with pytest.raises(MethodError) as refused:
                generate(model, method, "8", PROMPT, 16, NEW, set(), "query_agnostic")
            message = str(refused.value)
            assert "\n" not in message and name in message and repr(family) in message and reason in message
            continue
        out = generate(model, method, "8", PROMPT, 16, NEW, set(), "query_agnostic")
        assert len(out.tokens) == NEW, (family, name)
        if Capability.COMPRESSES in method.capabilities and Capability.WRAPS not in method.capabilities:
            for kept, layer in zip(out.kept_tokens_per_layer, layout.layers):
                expected = WINDOW - 1 if layer.kind == SLIDING else 8 + len(PROMPT) - 16
                assert kept <= expected, (family, name, out.kept_tokens_per_layer)


def test_learned_sinks_enter_the_scoring_softmax():
    """gpt-oss: the window attention SnapKV scores with sums to less than one per row (the sink takes its share),
    and equals the model's own attention probabilities (eager, with sinks) on the window rows."""
    model = model_of("gpt_oss")
    captured = {}
    from kvmethods.attention.prefill_compression import compressing_prefill
    from kvmethods.scorers.scoring import window_attention
    from kvmethods.adapters.transformers_compat import DynamicCache, cache_argument

    class Spy(_WindowOnly):
        def kept_indices(self, layer, n):
            captured[layer.layer_idx] = window_attention(layer, 4)
            return super().kept_indices(layer, n)

    cache = DynamicCache()
    out = model(input_ids=torch.tensor([PROMPT]), output_attentions=True)
    with compressing_prefill(model, Spy(), [2, 2], cache):
        model(input_ids=torch.tensor([PROMPT]), use_cache=True, **cache_argument(model, cache))
    probs = captured[1]  # the global layer: [1, kv_heads, groups, 4, T]
    assert float(probs.sum(-1).max()) < 1.0
    own = out.attentions[1][0, :, -4:]  # [q_heads, 4, T]
    torch.testing.assert_close(probs[0].reshape(own.shape), own, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_family_table_says_before_loading_what_the_probe_finds(family):
    """core/family_table.py's layout from the config alone (the startup check, docs/models.md) equals the probe's
    on every point the rules read, so both refuse the same methods."""
    from kvmethods.core.family_table import layout_of

    model = model_of(family)
    probed, table = describe(model), layout_of(model.config)
    assert [(layer.kind, layer.window, layer.rope, bool(layer.sinks), layer.latent) for layer in table.layers] == \
           [(layer.kind, layer.window, layer.rope, bool(layer.sinks), layer.latent) for layer in probed.layers]
    assert table.needs_capture == probed.needs_capture
    for name in METHODS:
        capabilities = method_of(name).capabilities
        assert refusal(table, capabilities) == refusal(probed, capabilities), (family, name)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_facts_alone_refuse_what_the_config_refuses(family):
    """`kvbench methods` names the refusing families from core/family_table.py's facts alone (tested_layout: no config,
    no torch): the same refusals, with either sliding policy, as the tiny model's config gives."""
    from kvmethods.core.layout import COMPRESS, KEEP
    from kvmethods.core.family_table import layout_of, tested_layout
    from kvmethods.testing import family_config

    facts, config = tested_layout(family), layout_of(family_config(family))
    assert sorted(set(facts.kinds())) == config.kinds()
    for name in sorted(BUILTINS):
        for sliding in (KEEP, COMPRESS):
            capabilities = BUILTINS[name].capabilities
            assert refusal(facts, capabilities, sliding) == refusal(config, capabilities, sliding), (family, name)


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss"])
def test_the_memory_figures_count_the_window_layers_apart(family):
    """kv_bytes_window is what the sliding layers hold (window - 1 tokens per head), inside kv_bytes_after; the
    rest is the compressed global layers' share; a model without window layers records no such field."""
    from kvmethods.runtime.generation import record_fields

    model = model_of(family)
    out = generate(model, get_method("snapkv", window=4), "8", PROMPT, len(PROMPT), NEW, EOS, "question_in_window")
    per_token = 2 * model.config.num_key_value_heads * model.config.head_dim * 4  # K and V, float32
    assert out.kv_bytes_window == (WINDOW - 1) * per_token
    assert out.kv_bytes_after - out.kv_bytes_window == 8 * per_token  # the global layer at its budget
    assert record_fields(out)["kv_bytes_window"] == out.kv_bytes_window
    plain = generate(model_of("llama"), get_method("snapkv", window=4), "8", PROMPT, len(PROMPT), NEW, EOS,
                     "question_in_window")
    assert plain.kv_bytes_window is None and "kv_bytes_window" not in record_fields(plain)

