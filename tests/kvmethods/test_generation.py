"""Compressed generation on tiny Llama/Mistral/Qwen2/Qwen3 models built from configs.

Checks what makes the benchmark numbers trustworthy: the cache holds exactly the budget, no-compression
runs are token-identical to model.generate, decoding after compression uses the original RoPE positions,
the question appended by the query-agnostic protocol is uncompressed, and uneven per-layer caches
(PyramidKV) get correct masks.
"""

from dataclasses import dataclass

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import kvmethods
from kvmethods import (
    Budget,
    Method,
    MethodError,
    available_methods,
    get_method,
    register_method,
)
from kvmethods.attention.prefill_compression import per_layer_causal_masks
from kvmethods.attention.families import decoder_layers
from kvmethods.runtime import generation, prompt_forward
from kvmethods.runtime.generation import PROTOCOLS, generate, prefill, teacher_force
from kvmethods.testing import tiny_model
from kvmethods.adapters.transformers_compat import cache_argument
from model_helpers import one_thread  # noqa: F401 (a module-scoped autouse fixture: applies here)

FAMILIES = ["llama", "mistral", "qwen2", "qwen3"]
BUILTINS = ["full", "h2o", "knorm", "pyramidkv", "random", "snapkv", "streamingllm", "tova"]
PROMPT = torch.randint(3, 256, (64,), generator=torch.Generator().manual_seed(11)).tolist()




@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return tiny_model(request.param, seed=3, qk_scale=4.0)


def layer_lengths(cache):
    return [layer.keys.shape[-2] for layer in cache.layers]


@pytest.mark.parametrize("method_name", [m for m in BUILTINS if m != "full"])
@pytest.mark.parametrize("budget, expected", [("24", 24), ("r0.5", 32), ("8", 8)])
def test_cache_holds_exactly_the_budget_per_layer_and_kv_head(model, method_name, budget, expected):
    method = get_method(method_name, **({"window": 4} if method_name == "pyramidkv" else {}))
    state = prefill(model, method, Budget.parse(budget), PROMPT, len(PROMPT), "question_in_window")
    lengths = layer_lengths(state.cache)
    kv_heads, head_dim = model.config.num_key_value_heads, state.cache.layers[0].keys.shape[-1]
    for layer, n in zip(state.cache.layers, lengths):
        assert layer.keys.shape == layer.values.shape == (1, kv_heads, n, head_dim)
    if method_name == "pyramidkv":
        assert sum(lengths) == expected * len(lengths) and lengths[0] > lengths[-1]
    else:
        assert lengths == [expected] * len(lengths)
    out = generate(model, method, Budget.parse(budget), PROMPT, len(PROMPT), 2, set(), "question_in_window")
    assert out.kept_tokens_per_layer == lengths  # measured, as the record reports it
    per_token = 2 * kv_heads * head_dim * 4  # keys + values, float32, per layer
    assert out.kv_bytes_before == per_token * len(PROMPT) * len(lengths)
    assert out.kv_bytes_after == per_token * sum(lengths)


@pytest.fixture(scope="module")
def generate_reference(model):
    """12 greedy tokens from plain model.generate."""
    return model.generate(torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False, eos_token_id=None,
                          pad_token_id=2)[0, len(PROMPT):].tolist()


@pytest.mark.parametrize("method_name", BUILTINS)
def test_no_compression_is_token_identical_to_model_generate(model, generate_reference, method_name):
    for budget, protocol in [(str(len(PROMPT)), "question_in_window"), ("4096", "query_agnostic"),
                             ("r0", "question_in_window")]:
        out = generate(model, get_method(method_name), budget, PROMPT, 50, 12, set(), protocol)
        assert out.tokens == generate_reference
        assert out.kept_tokens_per_layer == [len(PROMPT)] * model.config.num_hidden_layers


def test_full_is_token_identical_to_generate_and_stops_at_eos(model, generate_reference):
    reference = generate_reference[:10]
    out = generate(model, get_method("full"), "128", PROMPT, len(PROMPT), 10, set(), "question_in_window")
    assert out.tokens == reference and out.prompt_tokens == len(PROMPT)
    stop = reference[4]
    first = reference.index(stop)
    out = generate(model, get_method("full"), "128", PROMPT, len(PROMPT), 10, {stop}, "question_in_window")
    assert out.tokens == reference[:first]


def masked_reference_logits(eager_model, ids, visible):
    """Last-row logits of a full forward where row i sees column j iff visible(i, j) (and j <= i)."""
    T = len(ids)
    mask = torch.full((1, 1, T, T), torch.finfo(torch.float64).min, dtype=torch.float64)
    for i in range(T):
        for j in range(i + 1):
            if visible(i, j):
                mask[0, 0, i, j] = 0.0
    with torch.no_grad():
        return eager_model(torch.tensor([ids]), attention_mask=mask).logits[0, -1]


@pytest.fixture(scope="module")
def llama_pair():
    sdpa = tiny_model("llama", seed=5, dtype=torch.float64, qk_scale=4.0)
    eager = tiny_model("llama", seed=6, dtype=torch.float64, attn_implementation="eager")
    eager.load_state_dict(sdpa.state_dict())
    return sdpa, eager


def step(model, cache, token, position):
    with torch.no_grad():
        return model(input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[position]]),
                     use_cache=True, **cache_argument(model, cache)).logits[0, -1]


def test_decoding_after_compression_uses_original_positions(llama_pair):
    sdpa, eager = llama_pair
    T, kept = len(PROMPT), set(range(4)) | set(range(len(PROMPT) - 12, len(PROMPT)))
    state = prefill(sdpa, get_method("streamingllm", sinks=4), "16", PROMPT, T, "question_in_window")
    token = int(state.next_logits.argmax())
    got = step(sdpa, state.cache, token, T)
    expected = masked_reference_logits(eager, PROMPT + [token], lambda i, j: i < T or j in kept or j == T)
    torch.testing.assert_close(got, expected, rtol=1e-7, atol=1e-7)
    # the test can fail: RoPE positions shifted down to the cache length give other logits
    state = prefill(sdpa, get_method("streamingllm", sinks=4), "16", PROMPT, T, "question_in_window")
    shifted = step(sdpa, state.cache, token, 16)
    assert not torch.allclose(shifted, expected, rtol=1e-4, atol=1e-4)


def test_query_agnostic_compresses_context_and_appends_question(llama_pair):
    sdpa, eager = llama_pair
    context_len, T = 48, len(PROMPT)
    state = prefill(sdpa, get_method("streamingllm", sinks=4), "16", PROMPT, context_len, "query_agnostic")
    assert layer_lengths(state.cache) == [16 + T - context_len] * sdpa.config.num_hidden_layers
    kept = set(range(4)) | set(range(context_len - 12, context_len))
    assert all(set(head.tolist()) == kept for layer in state.kept_indices for head in layer[0])
    expected = masked_reference_logits(eager, PROMPT, lambda i, j: i < context_len or j in kept or j >= context_len)
    torch.testing.assert_close(state.next_logits, expected, rtol=1e-7, atol=1e-7)
    out = generate(sdpa, get_method("streamingllm"), "16", PROMPT, context_len, 3, set(), "query_agnostic")
    assert out.kept_tokens_per_layer == [16 + T - context_len] * sdpa.config.num_hidden_layers


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_teacher_forcing_on_uneven_pyramid_caches_matches_stepwise_decoding(model, protocol):
    method, targets = get_method("pyramidkv", window=8), PROMPT[5:14]
    logp = teacher_force(model, method, "24", PROMPT, 40, targets, protocol)
    assert logp.shape == (len(targets), model.config.vocab_size)
    state = prefill(model, method, "24", PROMPT, 40, protocol)
    assert state.uneven and len(set(layer_lengths(state.cache))) > 1
    rows = [state.next_logits]
    for offset, token in enumerate(targets[:-1]):
        rows.append(step(model, state.cache, token, len(PROMPT) + offset))
    torch.testing.assert_close(logp, torch.log_softmax(torch.stack(rows).float(), -1), rtol=1e-4, atol=1e-4)
    greedy = generate(model, method, "24", PROMPT, 40, 6, set(), protocol).tokens
    assert teacher_force(model, method, "24", PROMPT, 40, greedy, protocol).argmax(-1).tolist() == greedy


def test_a_decoding_step_over_uneven_layers_runs_unmasked_and_a_multi_token_forward_masked(model):
    state = prefill(model, get_method("pyramidkv", window=8), "24", PROMPT, len(PROMPT), "question_in_window")
    assert state.uneven and len(set(layer_lengths(state.cache))) > 1
    seen = []

    def record(module, args, kwargs):  # registered after per_layer_causal_masks' hooks: sees what they set
        seen.append(kwargs.get("attention_mask"))

    for ids in ([5], [6, 7]):
        seen.clear()
        lengths = layer_lengths(state.cache)
        with per_layer_causal_masks(model, state.cache):
            handles = [layer.self_attn.register_forward_pre_hook(record, with_kwargs=True)
                       for layer in decoder_layers(model)]
            try:
                step_logits = generation.forward(model, state.cache, ids, state.next_position, False, 1)
            finally:
                for handle in handles:
                    handle.remove()
        state.next_position += len(ids)
        if len(ids) == 1:  # every layer sees its whole cache: sdpa's unmasked path, as for even layers
            assert seen == [None] * len(lengths)
        else:
            assert [tuple(mask.shape) for mask in seen] == [(1, 1, 2, n + 2) for n in lengths]
            assert all(bool((mask[0, 0, 0, -1] < 0) and (mask[0, 0, 1] == 0).all()) for mask in seen)
        assert torch.isfinite(step_logits).all()


def test_forwards_over_a_filled_cache_keep_cudnn_attention_off_on_cuda(model, monkeypatch):
    cudnn = torch.backends.cuda.cudnn_sdp_enabled()
    monkeypatch.setattr(prompt_forward, "device_of", lambda model: torch.device("cuda"))
    with prompt_forward.cached_forward_kernels(model, 0):  # the prompt's own forward: torch's choice
        assert torch.backends.cuda.cudnn_sdp_enabled() == cudnn
    with prompt_forward.cached_forward_kernels(model, 40):
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    assert torch.backends.cuda.cudnn_sdp_enabled() == cudnn
    monkeypatch.setattr(prompt_forward, "device_of", lambda model: torch.device("cpu"))
    with prompt_forward.cached_forward_kernels(model, 40):  # CPU: nothing changes
        assert torch.backends.cuda.cudnn_sdp_enabled() == cudnn


def test_teacher_force_full_equals_plain_forward(model):
    targets = PROMPT[:7]
    logp = teacher_force(model, get_method("full"), "8", PROMPT, 30, targets, "query_agnostic")
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT + targets[:-1]])).logits[0, len(PROMPT) - 1:]
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1), rtol=1e-5, atol=1e-5)
    assert teacher_force(model, get_method("snapkv"), "8", PROMPT, 30, [], "query_agnostic").shape[0] == 0


@dataclass
class KeepNewestPerHead(Method):
    """A third-party method: keeps the most recent tokens, skipping `gap` tokens at the end."""

    name = "keep_newest_test"
    gap: int = kvmethods.param(0, "most recent tokens to drop", minimum=0)

    def kept_indices(self, layer, n_keep):
        stop = layer.seq_len - self.gap
        return torch.arange(stop - n_keep, stop).expand(*layer.keys.shape[:2], n_keep)


def test_user_registered_method_runs_like_a_builtin(model):
    register_method(KeepNewestPerHead)
    try:
        assert "keep_newest_test" in available_methods()
        method = get_method("keep_newest_test", gap="5")
        state = prefill(model, method, "20", PROMPT, len(PROMPT), "question_in_window")
        assert [head.tolist() for head in state.kept_indices[0][0]] == [list(range(39, 59))] * 2
        out = generate(model, method, "20", PROMPT, len(PROMPT), 3, set(), "question_in_window")
        assert out.kept_tokens_per_layer == [20] * model.config.num_hidden_layers and len(out.tokens) == 3
    finally:
        kvmethods.unregister_method("keep_newest_test")


def test_malformed_kept_indices_from_a_method_are_reported(model):
    @dataclass
    class TooFew(Method):
        name = "too_few_test"

        def kept_indices(self, layer, n_keep):
            return torch.arange(n_keep - 1).expand(*layer.keys.shape[:2], n_keep - 1)

    with pytest.raises(MethodError, match="too_few_test: kept_indices must be an integer tensor of shape"):
        prefill(model, TooFew(), "20", PROMPT, len(PROMPT), "question_in_window")

    @dataclass
    class Repeats(Method):
        name = "repeats_test"

        def kept_indices(self, layer, n_keep):
            return torch.zeros(*layer.keys.shape[:2], n_keep, dtype=torch.long)

    with pytest.raises(MethodError, match="repeats_test: kept_indices repeat a position"):
        prefill(model, Repeats(), "20", PROMPT, len(PROMPT), "question_in_window")


def test_unsupported_families_and_sliding_windows_are_named():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=256, n_positions=128, bos_token_id=0, eos_token_id=1)).eval()
    with pytest.raises(MethodError, match="snapkv cannot compress model family 'gpt2': it has no decoder `layers`"):
        generate(gpt2, get_method("snapkv"), "16", PROMPT, len(PROMPT), 2, set(), "question_in_window")
    # every layer of a mistral with a window is a sliding layer: kept as its window (window - 1 tokens), not
    # compressed further (kvmethods/core/layout.py)
    mistral = tiny_model("mistral", sliding_window=32)
    out = generate(mistral, get_method("h2o"), "16", PROMPT, len(PROMPT), 2, set(), "question_in_window")
    assert out.kept_tokens_per_layer == [31] * mistral.config.num_hidden_layers


def test_bad_protocol_and_context_len_are_method_errors(model):
    with pytest.raises(MethodError, match="unknown protocol 'both'; valid protocols: question_in_window, query_agnostic"):
        generate(model, get_method("snapkv"), "16", PROMPT, 10, 2, set(), "both")
    with pytest.raises(MethodError, match="context_len 99 outside"):
        generate(model, get_method("snapkv"), "16", PROMPT, 99, 2, set(), "query_agnostic")
