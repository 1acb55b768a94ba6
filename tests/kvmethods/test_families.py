"""Every decoder family of kvmethods/testing.py (FAMILIES): its description, identity at a full budget, windows kept
exactly, and every built-in method either compressing it or refused in one line naming family, method and why."""

from __future__ import annotations

import pytest
import torch

from kvmethods import MethodError, get_method
from kvmethods.core.capabilities import Capability
from kvmethods.core.catalog import BUILTINS
from kvmethods.families.layout import CAPTURED, GLOBAL, LINEAR, PROJECTION, SLIDING, refusal
from kvmethods.families.probe import describe
from kvmethods.runtime.generation import generate, prefill
from kvmethods.runtime.shared_prefill import can_share_prefill, shared_prefill
from kvmethods.testing import FAMILIES, WINDOW, family_model

PROMPT = list(range(3, 3 + 24))  # longer than the tiny hybrids' window (12)
NEW = 4
# Built-ins by spec: parameters fit the tiny models (head_dim 16: KIVI's groups), hf_quantized needs quanto.
METHOD_PARAMS = {"kivi": dict(group_size=16, residual=16)}
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


# qwen3_next: the full cache of a model with linear-attention layers needs the model's own mixed cache, which
# kvmethods' prefill does not build yet (the next step of issue 38).
NOT_YET = ()
# deepseek_v3: transformers' own forward of several tokens over a filled cache fails (a tensor size mismatch in
# its attention, with plain DynamicCache and no kvmethods code): its prompts run whole (question_in_window).
WHOLE_PROMPT_ONLY = ()


@pytest.mark.parametrize("family", [f for f in FAMILIES if f not in NOT_YET])
def test_a_full_budget_gives_the_models_own_generate(family):
    """Every method the family supports, at a budget above the prompt, decodes the tokens and log-probs of the
    model's own uncompressed generate (alone, and from the shared prefill)."""
    model = model_of(family)
    tokens, logprobs = reference(model)
    for name in METHODS:
        method = method_of(name)
        if LOSSY & method.capabilities or _refused(model, method):
            continue
        protocol, context = ("question_in_window", len(PROMPT)) if family in WHOLE_PROMPT_ONLY else ("query_agnostic", 16)
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
        if name == "full" and family in NOT_YET + WHOLE_PROMPT_ONLY:
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
    from kvmethods.attention.hooks import compressing_prefill
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
    """families/table.py's layout from the config alone (the startup check, docs/models.md) equals the probe's
    on every point the rules read, so both refuse the same methods."""
    from kvmethods.families.table import layout_of

    model = model_of(family)
    probed, table = describe(model), layout_of(model.config)
    assert [(layer.kind, layer.window, layer.rope, bool(layer.sinks), layer.latent) for layer in table.layers] == \
           [(layer.kind, layer.window, layer.rope, bool(layer.sinks), layer.latent) for layer in probed.layers]
    assert table.needs_capture == probed.needs_capture
    for name in METHODS:
        capabilities = method_of(name).capabilities
        assert refusal(table, capabilities) == refusal(probed, capabilities), (family, name)


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


def test_linear_layers_state_is_counted_in_the_memory_figures_and_the_byte_allowance():
    """qwen3_next: the linear layer's convolution and recurrent state is in kv_bytes_before and kv_bytes_after in
    full (kv_bytes_state), the softmax layer holds its budget, and a byte budget allows its fraction of the
    per-token cache plus the state (which no method can shrink)."""
    from kvmethods.runtime.generation import record_fields

    model = model_of("qwen3_next")
    config = model.config
    conv_dim = 2 * config.linear_num_key_heads * config.linear_key_head_dim \
        + config.linear_num_value_heads * config.linear_value_head_dim
    recurrent = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim
    state = 4 * (conv_dim * config.linear_conv_kernel_dim + recurrent)  # float32
    per_token = 2 * config.num_key_value_heads * config.head_dim * 4  # the one softmax layer, K and V
    out = generate(model, get_method("snapkv", window=4), "8", PROMPT, len(PROMPT), NEW, EOS, "question_in_window")
    assert out.kv_bytes_state == state and record_fields(out)["kv_bytes_state"] == state
    assert out.kv_bytes_before == len(PROMPT) * per_token + state
    assert out.kv_bytes_after == 8 * per_token + state
    assert out.kept_tokens_per_layer == [0, 8] and out.kept_tokens_per_head[0] == []
    half = generate(model, get_method("snapkv", window=4), "m0.5", PROMPT, len(PROMPT), NEW, EOS, "question_in_window")
    assert half.kv_bytes_budget == len(PROMPT) * per_token // 2 + state
    assert half.kv_bytes_after == half.kv_bytes_budget


def test_mla_eviction_equals_masking_the_evicted_tokens():
    """deepseek_v3 (MLA): evicting tokens from the cache (the latent and rotary key in transformers 5.24, the
    decompressed per-head keys and values in 5.2) decodes what the uncompressed model decodes with those tokens
    masked out: StreamingLLM keeps the same positions in every layer, so a plain attention mask is the oracle."""
    from kvmethods.adapters.transformers_compat import DynamicCache, cache_argument

    model = model_of("deepseek_v3")
    out = generate(model, get_method("streamingllm", sinks=4), "8", PROMPT, len(PROMPT), NEW, set(),
                   "question_in_window", return_logprobs=True)
    assert out.kept_tokens_per_layer == [8, 8]
    cache, visible = DynamicCache(), torch.ones(1, len(PROMPT), dtype=torch.long)
    logits = model(input_ids=torch.tensor([PROMPT]), use_cache=True, **cache_argument(model, cache)).logits[0, -1]
    visible[0, 4:len(PROMPT) - 4] = 0  # what StreamingLLM evicts: all but 4 sinks and the last 4
    steps = []
    for position in range(len(PROMPT), len(PROMPT) + NEW):
        steps.append(torch.log_softmax(logits, -1))
        if len(steps) == NEW:
            break
        visible = torch.cat([visible, torch.ones(1, 1, dtype=torch.long)], dim=1)
        logits = model(input_ids=logits.argmax().view(1, 1), attention_mask=visible,
                       position_ids=torch.tensor([[position]]), use_cache=True,
                       **cache_argument(model, cache)).logits[0, -1]
    torch.testing.assert_close(out.logprobs, torch.stack(steps), atol=1e-4, rtol=0)
    assert out.tokens == [int(step.argmax()) for step in steps]


def test_mla_methods_keep_one_set_of_positions_for_every_head():
    """deepseek_v3 in transformers 5.24 caches the latent (one row per token for every head): a scoring method's
    per-head scores from the decompressed keys are averaged into one selection; in 5.2 the cache holds the
    decompressed keys per head, selected per head."""
    model = model_of("deepseek_v3")
    for name in ("snapkv", "h2o", "tova", "knorm", "criticalkv", "pyramidkv"):
        out = generate(model, get_method(name), "8", PROMPT, len(PROMPT), NEW, set(), "question_in_window")
        heads = {len(per_head) for per_head in out.kept_tokens_per_head}
        assert heads == ({1} if latent_cache(model) else {model.config.num_attention_heads}), (name, heads)
        assert max(map(max, out.kept_tokens_per_head)) < len(PROMPT), name


def latent_cache(model) -> bool:
    """Whether this transformers caches an MLA layer as its latent (one row per token), not per head."""
    from kvmethods.adapters.transformers_compat import DynamicCache, cache_argument

    cache = DynamicCache()
    model(input_ids=torch.tensor([PROMPT[:2]]), use_cache=True, **cache_argument(model, cache))
    return cache.layers[0].keys.shape[1] == 1


@pytest.mark.parametrize("family", ["deepseek_v3", "qwen3_next"])
def test_shared_prefill_members_decode_in_a_batch_as_alone(family):
    """MLA's latent layers (values narrower than keys) batch like any dense layer; a linear layer's state joins the
    batch stacked along the batch axis (each member's row its own), kivi's quantized layers too; members leave the
    batch as they stop (max_new_tokens differs); teacher forcing of targets the members did not decode runs batched."""
    from kvmethods.core.budget import Budget
    from kvmethods.runtime.batched_generation import BatchRequest, batch_kind, generate_batch

    model = model_of(family)
    requests = [(get_method(name), Budget.parse(budget)) for name in ("snapkv", "h2o", "streamingllm")
                for budget in ("6", "64")]
    shared = shared_prefill(model, requests, PROMPT, 16, "query_agnostic")
    members = [BatchRequest(method, budget, state) for (method, budget), state in zip(requests, shared.selections)]
    members.append(BatchRequest(get_method("full"), None, shared.reference))
    assert {batch_kind(m.method, m.state) for m in members} == {"padded"}
    targets = [5, 6, 7, 8]
    # qwen3_next: snapkv@6 decodes 25 first, the budget-64 members and the full cache 121 at their 6th step: more
    # than half the rows stop while two go on, so the batch drops rows (the stacked state's too)
    eos, new = ({25, 121} if family == "qwen3_next" else set()), 8
    own = [generate(model, m.method, None, PROMPT, 16, new, eos, "query_agnostic", return_logprobs=True,
                    teacher_targets=targets,
                    prefilled=shared_prefill(model, [(m.method, m.budget)], PROMPT, 16, "query_agnostic").selections[0])
           for m in members[:-1]]
    own.append(generate(model, get_method("full"), "full", PROMPT, 16, new, eos, "query_agnostic",
                        return_logprobs=True, teacher_targets=targets))
    batched = generate_batch(model, members, len(PROMPT), new, eos, return_logprobs=True, teacher_targets=targets)
    for one, other in zip(batched, own):
        assert (one.tokens, one.stop_token) == (other.tokens, other.stop_token)
        torch.testing.assert_close(one.logprobs, other.logprobs, atol=1e-4, rtol=0)
        torch.testing.assert_close(one.target_logprobs, other.target_logprobs, atol=1e-4, rtol=0)
    if family == "qwen3_next":
        assert sorted(len(one.tokens) for one in batched) == [1, 5, 5, 5, 5, 8, 8]
    if family == "qwen3_next":  # kivi's own storage batches as members, the linear state stacked with them
        kivi = [BatchRequest(method_of("kivi"), None, prefill(model, method_of("kivi"), "full", PROMPT, 16,
                                                               "query_agnostic")) for _ in range(2)]
        assert {batch_kind(m.method, m.state) for m in kivi} == {"members"}
        alone = generate(model, method_of("kivi"), "full", PROMPT, 16, NEW, EOS, "query_agnostic", return_logprobs=True)
        for one in generate_batch(model, kivi, len(PROMPT), NEW, EOS, return_logprobs=True):
            assert one.tokens == alone.tokens
            torch.testing.assert_close(one.logprobs, alone.logprobs, atol=1e-4, rtol=0)



def test_a_batched_latent_layer_grows_its_narrower_values_too():
    """MLA's latent cache layer: keys (the latent) and values (the rotary key) differ in width; a batch out of room
    grows both, and returns each member's tokens in order."""
    from kvmethods.adapters.transformers_compat import DynamicLayer
    from kvmethods.storage.batched import BatchedLayer

    keys, values = torch.randn(1, 1, 5, 16), torch.randn(1, 1, 5, 8)
    layer = DynamicLayer()
    layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values
    batch = BatchedLayer([layer], room=0)
    new_keys, new_values = torch.randn(1, 1, 2, 16), torch.randn(1, 1, 2, 8)
    all_keys, all_values = batch.update(new_keys, new_values)
    torch.testing.assert_close(all_keys, torch.cat([keys, new_keys], dim=-2))
    torch.testing.assert_close(all_values, torch.cat([values, new_values], dim=-2))


def test_mla_memory_figures_and_byte_budgets_count_what_the_cache_holds():
    """deepseek_v3: kv_bytes_before is the latent and rotary key of every prompt token (transformers 5.24) or their
    keys and values decompressed per head (5.2), not the config's KV heads x head_dim; a byte budget keeps its
    fraction of that."""
    model = model_of("deepseek_v3")
    config = model.config
    if latent_cache(model):
        per_token = (config.kv_lora_rank + config.qk_rope_head_dim) * 4
    else:
        per_token = config.num_attention_heads * (config.qk_nope_head_dim + config.qk_rope_head_dim
                                                  + config.v_head_dim) * 4
    out = generate(model, get_method("snapkv", window=4), "m0.5", PROMPT, len(PROMPT), NEW, EOS, "question_in_window")
    assert out.kv_bytes_before == len(PROMPT) * per_token * config.num_hidden_layers
    assert out.kv_bytes_budget == out.kv_bytes_before // 2 == out.kv_bytes_after
    assert out.kept_tokens_per_layer == [len(PROMPT) // 2] * config.num_hidden_layers


@pytest.mark.parametrize("family", ["qwen3_next", "deepseek_v3"])
def test_shared_context_and_multi_turn_on_linear_and_latent_caches(family):
    """Several questions on one compressed context answer as one prefill per question (the linear layers' state,
    updated in place by every question, is put back with the rest of the cache), and multi-turn with the full cache
    is plain greedy generation over the growing history."""
    from kvmethods.runtime.protocols import answer_questions, run_turns

    model = model_of(family)
    context, questions = PROMPT[:16], [list(range(40, 46)), list(range(60, 64))]
    for name, budget in (("full", "r0"), ("snapkv", "8"), ("h2o", "8")):
        shared = answer_questions(model, get_method(name), budget, context, questions, NEW, set())
        for question, out in zip(questions, shared):
            alone = generate(model, get_method(name), budget, context + question, len(context), NEW, set(),
                             "query_agnostic", return_logprobs=True)
            assert out.tokens == alone.tokens, (name, question)
            assert out.kept_tokens_per_layer == alone.kept_tokens_per_layer
    history = list(context)
    for question, out in zip(questions, run_turns(model, get_method("full"), "r0", context, questions, NEW, set())):
        history += question
        plain = generate(model, get_method("full"), "r0", history, len(history), NEW, set(), "question_in_window")
        assert out.tokens == plain.tokens
        history += plain.tokens


@pytest.mark.parametrize("family", ["qwen3_next", "deepseek_v3"])
@pytest.mark.parametrize("spec", [dict(name="decoding", base="snapkv", interval=8, window=4),
                                  dict(name="decoding", base="streamingllm", interval=6), dict(name="rkv", interval=8)])
def test_compression_while_decoding_cuts_linear_and_latent_caches_back(family, spec):
    """rkv and `decoding` cut the softmax layers back to the budget every `interval` tokens (MLA: the latent, from
    the decompressed keys of the last forward), and leave the linear layers' state alone."""
    params = dict(spec)
    method = get_method(params.pop("name"), **params)
    out = generate(model_of(family), method, "8", PROMPT, len(PROMPT), 20, set(), "question_in_window")
    lengths = out.decode_cache_lengths
    assert len(out.tokens) == 20 and max(lengths) == 8 + spec["interval"] - 1 and min(lengths) == 8
