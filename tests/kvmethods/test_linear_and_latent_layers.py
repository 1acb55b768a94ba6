"""Layers that hold something else than per-token keys and values per KV head: qwen3_next's linear-attention layers
(a fixed state, kvmethods/adapters/mixed_cache.py) and DeepSeek-V3's multi-head latent attention (transformers 5.24
caches the latent: kvmethods/attention/latent.py). Their memory figures and byte budgets count what the cache holds,
MLA eviction equals masking the evicted tokens, and every road (shared prefill, batched decoding within and across
samples, the shared-context and multi-turn protocols, compression while decoding) runs them as it runs the others,
in transformers 5.24 and 5.2 alike (tests/kvmethods/test_families.py covers identity and refusals)."""

from __future__ import annotations

import pytest
import torch

from kvmethods import get_method
from kvmethods.runtime.generation import generate, prefill
from kvmethods.runtime.shared_prefill import shared_prefill
from test_families import EOS, NEW, PROMPT, method_of, model_of


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


@pytest.mark.parametrize("family", ["qwen3_next", "deepseek_v3"])
def test_members_of_different_prompts_decode_in_one_batch_as_alone(family):
    """Batching across samples: members of prompts of different lengths (so different linear states, latent rows
    padded to the longest) decode in one batch, each at its own positions, as each decodes alone."""
    from kvmethods.core.budget import Budget
    from kvmethods.runtime.batched_generation import BatchRequest, generate_batch

    model = model_of(family)
    prompts = [PROMPT, list(range(50, 81))]
    members, alone = [], []
    for ids in prompts:
        for name in ("snapkv", "full"):
            budget = Budget.parse("8" if name == "snapkv" else "full")
            state = prefill(model, get_method(name), budget, ids, 16, "query_agnostic")
            members.append(BatchRequest(get_method(name), budget, state, prompt_tokens=len(ids)))
            alone.append(generate(model, get_method(name), budget, ids, 16, NEW, set(), "query_agnostic",
                                  return_logprobs=True))
    for one, other in zip(generate_batch(model, members, len(PROMPT), NEW, set(), return_logprobs=True), alone):
        assert one.tokens == other.tokens
        torch.testing.assert_close(one.logprobs, other.logprobs, atol=1e-4, rtol=0)
