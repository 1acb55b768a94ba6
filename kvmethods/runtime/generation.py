"""Compressed prefill, greedy decoding and teacher forcing: what the harness runs per sample.

Protocols, selectable per run:
- "question_in_window": compress the whole prompt; the question sits in the observation window
  (how the SnapKV/PyramidKV LongBench tables were made);
- "query_agnostic": compress input_ids[:context_len] only, then append the rest uncompressed;
- "shared_context", "multi_turn": several questions on one compressed context (kvmethods/runtime/protocols/);
  a single prompt under them is compressed as query_agnostic.
Methods that score from the whole prompt (KVzip) compress after a plain prefill instead of inside it.
A head-adaptive method's cache is stored ragged (ragged.py) and reported per head. A quantizer (KIVI,
alone or composed: `snapkv+kivi`) then stores each compressed layer its own way (method.storage_layer), and
a byte budget ("m0.25") becomes each method's token count through memory_budget.operating_point.
After compression, later tokens keep their original RoPE positions (position_ids = true positions),
while the causal mask follows the actual cache lengths (prefill_compression.per_layer_causal_masks when layers
differ). The model is only called through its public forward with a DynamicCache.
"""

from __future__ import annotations

import contextlib
import copy
from contextlib import ExitStack
from dataclasses import dataclass, field

import torch

from ..core.base import Method
from ..core.budget import Budget
from ..core.capabilities import REWRITES_WHILE_DECODING, Capability
from ..core.catalog import GROUP_PROTOCOLS, PROTOCOLS  # noqa: F401 (this contract's names too)
from ..attention.families import check_family, sliding_windows
from ..attention.gqa_attention import masked_gqa
from ..attention.prefill_compression import capturing_window_queries, compressing_prefill, store_selection
from ..storage.ragged import RaggedLayer, cache_bytes, kept_tokens_per_head
from ..attention.ragged_attention import kernel_name
from ..storage.window_layer import WindowLayer
from ..adapters.transformers_compat import DynamicCache
from ..adapters.mixed_cache import is_state_layer, new_cache, state_bytes, token_layers
from .budget_plan import plan_budget
from .prompt_forward import check_request, device_of, forward, is_uneven, layer_masks, store_quantized
from .sliding_decode import windowed_for_decoding
from ..core.clock import now

# GROUP_PROTOCOLS (catalog.py): samples sharing a context run as one group (kvmethods/runtime/protocols/); a single
# prompt under them is compressed as query_agnostic does.


@dataclass
class GenerationOutput:
    tokens: list[int]  # generated ids, greedy, without the eos that stopped decoding
    kept_tokens_per_layer: list[int]  # measured cache length of each layer once the prompt is in
    kv_bytes_before: int  # bytes of an uncompressed cache of the prompt
    kv_bytes_after: int  # bytes actually held once the prompt is in (before decoding)
    prompt_tokens: int
    prefill_s: float  # prefill + compression (+ uncompressed question) up to the first token's logits
    decode_s: float
    stop_token: int | None = None  # the eos id that stopped decoding, None when max_new_tokens did
    # With return_logprobs: [len(tokens) (+1 with stop_token), vocab] log-probs of every decoding step,
    # i.e. this run's own distributions over tokens (+ [stop_token]).
    logprobs: torch.Tensor | None = None
    # With teacher_targets: teacher_force()'s result for those targets, from the same compressed prefill.
    target_logprobs: torch.Tensor | None = None
    # Per layer, the tokens each KV head holds once the prompt is in (they differ under adakv).
    kept_tokens_per_head: list[list[int]] = field(default_factory=list)
    # kv_bytes_after split: the kept tokens' keys and values (logical) and what the cache's tensors hold
    # (physical); they differ only if a storage pads. kv_bytes_after == kv_bytes_physical.
    kv_bytes_logical: int = 0
    kv_bytes_physical: int = 0
    ragged_kernel: str | None = None  # how attention ran over a ragged (head-adaptive) cache, else None
    scoring_s: float = 0.0  # part of prefill_s spent in a method's extra scoring forward (KVzip)
    masked_only: bool = False  # evicted keys are masked, not freed (kvpress head-wise presses): no memory saved
    kv_bytes_budget: int | None = None  # a byte budget's allowance: its fraction of kv_bytes_before
    # Methods compressing while decoding (decoding_compression.py): the cache length (longest layer) after
    # each decoding step; empty for the others, whose cache grows by one token a step.
    decode_cache_lengths: list[int] = field(default_factory=list)
    # Of kv_bytes_after, what the sliding-window layers kept as their window hold (window_layer.py); None when
    # no layer is one. kv_bytes_after - kv_bytes_window is what the method's compression left in the others.
    kv_bytes_window: int | None = None
    # Of kv_bytes_before and kv_bytes_after, the linear-attention layers' state (convolution + recurrent), held in
    # full whatever the method; None when no layer is one.
    kv_bytes_state: int | None = None


def record_fields(out: GenerationOutput) -> dict:
    """The per-sample record fields that head-adaptive and whole-prompt-scoring methods added (issue 15)."""
    return {
        "kept_tokens_per_head": out.kept_tokens_per_head,
        "kv_bytes_logical": out.kv_bytes_logical,
        "kv_bytes_physical": out.kv_bytes_physical,
        "ragged_kernel": out.ragged_kernel,
        "scoring_ms": out.scoring_s * 1000.0,
        "kv_masked_only": out.masked_only,
        "kv_bytes_budget": out.kv_bytes_budget,
        # > 0: over the byte budget by that many bytes (a quantizer alone cannot trade tokens for bytes)
        "kv_budget_distance_bytes": None if out.kv_bytes_budget is None else out.kv_bytes_physical - out.kv_bytes_budget,
    } | ({"decode_cache_lengths": out.decode_cache_lengths} if out.decode_cache_lengths else {}) \
      | ({"kv_bytes_window": out.kv_bytes_window} if out.kv_bytes_window is not None else {}) \
      | ({"kv_bytes_state": out.kv_bytes_state} if out.kv_bytes_state is not None else {})


@dataclass
class PrefilledPrompt:
    cache: DynamicCache
    next_logits: torch.Tensor  # [vocab] logits predicting the token after the prompt
    next_position: int
    uneven: bool  # layers hold different lengths or are ragged: later forwards need per-layer masks
    kept_indices: list = field(default_factory=list)  # per layer [batch, kv_heads, n], a bool mask, or None
    scoring_s: float = 0.0  # seconds of a whole-prompt scoring pass (KVzip), included in the prefill
    # Tokens each layer keeps when a method compresses while decoding: the budget itself for token budgets
    # (not capped at the prompt length, which decoding outgrows), the prompt's share for ratio budgets.
    decode_layer_budgets: list[int] = field(default_factory=list)


@torch.inference_mode()
def prefill(model, method: Method, budget: Budget, input_ids: list[int], context_len: int, protocol: str,
            total_tokens: int | None = None) -> PrefilledPrompt:
    """Run the prompt through the model, compressing per the protocol; nothing is decoded yet."""
    check_request(method, input_ids, context_len, protocol)
    capabilities = method.capabilities
    if capabilities & (Capability.COMPRESSES | Capability.OWN_STORAGE):
        check_family(model, method, total_tokens or len(input_ids))
    plan = plan_budget(model, method, budget, len(input_ids), context_len, protocol)
    budget, compressed_len, n_layers, layer_budgets = plan.budget, plan.compressed_len, plan.n_layers, plan.layer_budgets
    cache = new_cache(model)
    kept_indices: list = [None] * n_layers
    logits = None
    scoring_s = 0.0
    with ExitStack() as stack:  # a channel-pruning storage (ThinK) scores with the last queries
        window = method.query_window
        queries = stack.enter_context(capturing_window_queries(model, cache, window)) if window else {}
        if plan.compresses:
            if Capability.RUNS_PREFILL in capabilities:
                ratio = budget.value if budget.kind == "ratio" else None
                with method.prefill_context(model, plan.tokens, compressed_len, ratio):
                    logits = forward(model, cache, input_ids[:compressed_len], 0, False, 1)
            elif Capability.SCORES_WHOLE_PROMPT in capabilities:
                logits = forward(model, cache, input_ids[:compressed_len], 0, False, 1)
                started = now()
                kept_indices = _compress_from_whole_prompt(model, method, layer_budgets, cache, input_ids[:compressed_len])
                scoring_s = now() - started
            else:  # a chunked prefill (chunked.py) compresses after each chunk; otherwise one chunk
                chunk = method.prefill_chunk or compressed_len
                with compressing_prefill(model, method, layer_budgets, cache) as kept_indices:
                    for start in range(0, compressed_len, chunk):
                        end = min(start + chunk, compressed_len)
                        logits = forward(model, cache, input_ids[start:end], start, is_uneven(cache), 1)
        elif compressed_len > 0:
            logits = forward(model, cache, input_ids[:compressed_len], 0, False, 1)
        if Capability.OWN_STORAGE in capabilities and compressed_len > 0:
            store_quantized(method, cache, queries, sliding_windows(model))
    uneven = is_uneven(cache)
    if compressed_len < len(input_ids):
        logits = forward(model, cache, input_ids[compressed_len:], compressed_len, uneven, 1)
    return PrefilledPrompt(cache, logits[-1], len(input_ids), uneven, list(kept_indices), scoring_s,
                           plan.decode_layer_budgets())


def _compress_from_whole_prompt(model, method: Method, layer_budgets: list[int], cache: DynamicCache,
                                ids: list[int]) -> list:
    """Compress every layer of a prefilled cache from the method's whole-prompt scores (KVzip)."""
    input_ids = torch.tensor([ids], dtype=torch.long, device=device_of(model))
    selections = method.select_layers(method.prefill_scores(model, cache, input_ids), layer_budgets)
    shared = Capability.SHARES_ACROSS_LAYERS in method.capabilities
    return [store_selection(cache, i, method, selection, None if shared else layer_budgets[i])
            for i, selection in enumerate(selections)]


def _bytes_per_token(cache: DynamicCache) -> int:
    """Bytes of one token's keys and values over all layers that hold tokens, and all their KV heads (keys and
    values may differ in width: DeepSeek-V3's latent and its rotary key)."""
    return sum(layer.keys.shape[1] * (layer.keys.shape[3] * layer.keys.element_size()
                                      + layer.values.shape[3] * layer.values.element_size())
               for layer in token_layers(cache))


@torch.inference_mode()
def generate(model, method: Method, budget, input_ids: list[int], context_len: int, max_new_tokens: int,
             eos_token_ids: set[int], protocol: str, *, return_logprobs: bool = False,
             teacher_targets: list[int] | None = None, prefilled: PrefilledPrompt | None = None) -> GenerationOutput:
    """Greedy generation with a compressed prompt cache; stops at an eos id (not returned) or max_new_tokens.

    ``teacher_targets`` also teacher-forces those tokens on a copy of the same compressed cache, so
    fidelity against a reference output costs no second prefill; ``return_logprobs`` keeps the
    distribution of every decoding step (the reference for other methods). ``prefilled``: the prompt's
    cache from shared_prefill(), decoded instead of prefilling here (prefill_s is then 0). An uncompressed cache's
    sliding layers decode over their window (sliding_decode.py), as transformers' own cache does.
    """
    input_ids = [int(token) for token in input_ids]
    budget = None if budget is None and prefilled is not None else Budget.parse(budget)
    eos = {int(token) for token in (eos_token_ids or ())}
    started = now()
    state = prefilled or prefill(model, method, budget, input_ids, context_len, protocol, len(input_ids) + max_new_tokens)
    prefill_s = now() - started
    out = measured_prefill(model, method, state, len(input_ids), prefill_s)
    if budget is not None and budget.kind == "memory":
        out.kv_bytes_budget = byte_allowance(budget, out)
    target_logprobs = None
    if teacher_targets is not None:
        target_logprobs = teacher_force_copy(model, state, teacher_targets)
    if not method.capabilities & REWRITES_WHILE_DECODING:  # measured: sliding layers decode over their window
        windowed_for_decoding(model, state.cache)

    started = now()
    out.tokens, out.stop_token, steps, out.decode_cache_lengths = decode_greedy(model, state, max_new_tokens, eos,
                                                                               return_logprobs, method)
    out.decode_s = now() - started
    out.logprobs = torch.stack(steps) if return_logprobs else None
    out.target_logprobs = target_logprobs
    return out


def byte_allowance(budget: Budget, out: GenerationOutput) -> int:
    """A byte budget's allowance: its fraction of the full cache's per-token keys and values, plus the linear
    layers' state in full (a fixed size the compression cannot trade: docs/models.md)."""
    state = out.kv_bytes_state or 0
    return int(budget.value * (out.kv_bytes_before - state)) + state


def measured_prefill(model, method: Method, state: PrefilledPrompt, prompt_tokens: int,
                     prefill_s: float) -> GenerationOutput:
    """What a prefilled cache holds (kept tokens per layer and head, bytes), as an output with nothing
    decoded yet: measure right after the prompt is in, before decoding adds to the cache."""
    per_head = kept_tokens_per_head(state.cache)
    logical, physical = cache_bytes(state.cache)
    masked = method.masked_tokens_per_head(model, state.cache)
    if masked is not None:  # kvpress' head-wise presses: attention skips them, memory still holds them
        per_head = [[n - m for n, m in zip(ns, ms)] for ns, ms in zip(per_head, masked)]
        logical -= sum(map(sum, masked)) * _bytes_per_token(state.cache) // sum(len(ms) for ms in masked)
    kept = [round(sum(heads) / len(heads)) if heads else 0 for heads in per_head]
    ragged = any(isinstance(layer, RaggedLayer) for layer in state.cache.layers)
    held_state = sum(state_bytes(layer) for layer in state.cache.layers)
    out = GenerationOutput([], kept, _bytes_per_token(state.cache) * prompt_tokens + held_state, physical,
                           prompt_tokens,
                           prefill_s, 0.0, None, None, None, per_head, logical, physical,
                           kernel_name(model) if ragged else None, state.scoring_s, masked is not None)
    windows = [layer for layer in state.cache.layers if isinstance(layer, WindowLayer)]
    out.kv_bytes_window = sum(layer.held_bytes() for layer in windows) if windows else None
    if any(is_state_layer(layer) for layer in state.cache.layers):
        out.kv_bytes_state = held_state
    return out


def decode_greedy(model, state: PrefilledPrompt, max_new_tokens: int, eos: set[int], return_logprobs: bool = False,
                  method: Method | None = None) -> tuple[list[int], int | None, list[torch.Tensor], list[int]]:
    """Greedy decoding on a prefilled cache: (tokens without the stopping eos, that eos or None, each
    step's log-probs when asked, the cache length after each step for methods compressing while decoding).
    The last token is not fed back, so the cache then holds the prompt and all tokens but the last;
    ``state.next_position`` follows. `method.while_decoding` wraps the loop (decoding_compression.py)."""
    tokens: list[int] = []
    steps: list[torch.Tensor] = []
    logits = state.next_logits
    with (method.while_decoding(model, state) if method is not None else contextlib.nullcontext([])) as lengths, \
            masked_gqa(model), layer_masks(model, state.cache, state.uneven):  # hooks once for the loop, not per step
        while True:
            if return_logprobs:
                steps.append(torch.log_softmax(logits.float(), dim=-1))
            next_token = int(logits.argmax())
            if next_token in eos:
                return tokens, next_token, steps, lengths
            tokens.append(next_token)
            if len(tokens) >= max_new_tokens:
                return tokens, None, steps, lengths
            logits = forward(model, state.cache, [next_token], state.next_position, state.uneven, 1, masked=True)[-1]
            state.next_position += 1


def teacher_force_copy(model, state: PrefilledPrompt, target_ids: list[int]) -> torch.Tensor:
    """teacher_force_prefilled on a copy of the prefilled cache, which stays as it was for decoding."""
    forked = PrefilledPrompt(copy.deepcopy(state.cache), state.next_logits, state.next_position, state.uneven)
    return teacher_force_prefilled(model, forked, [int(t) for t in target_ids])


def teacher_force_prefilled(model, state: PrefilledPrompt, target_ids: list[int]) -> torch.Tensor:
    rows = [state.next_logits.unsqueeze(0)]
    if len(target_ids) > 1:
        rows.append(forward(model, state.cache, target_ids[:-1], state.next_position, state.uneven, 0))
    logits = torch.cat(rows)[: len(target_ids)]
    return torch.log_softmax(logits.float(), dim=-1)


@torch.inference_mode()
def teacher_force(model, method: Method, budget, input_ids: list[int], context_len: int, target_ids: list[int],
                  protocol: str) -> torch.Tensor:
    """[len(target_ids), vocab] float32 log-probs; row i is the next-token distribution that predicts
    target_ids[i] given the compressed prompt and target_ids[:i]."""
    input_ids = [int(token) for token in input_ids]
    target_ids = [int(token) for token in target_ids]
    state = prefill(model, method, budget, input_ids, context_len, protocol, len(input_ids) + len(target_ids))
    return teacher_force_prefilled(model, state, target_ids)
