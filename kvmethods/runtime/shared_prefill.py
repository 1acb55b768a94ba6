"""One prefill, many compressed caches: the full cache plus every (method, budget) selection of a grid.

A prefill-time method shrinks a layer's cache only after that layer's attention has run on the full
keys, so the hidden states, and with them every later layer's inputs, do not depend on what earlier
layers kept: the M x B compressed prefills of a sweep are the same forward. This module runs that
forward once, with the full cache (the reference's), and a forward hook per attention module hands
each selection the layer's inputs (its own copy of the layer's keys and values, freed once its kept
positions are gathered, so a method that writes into them harms only itself) and stores its
selection in the selection's own cache (prefill_compression.store_selection). The scoring that does not depend on the
budget (SnapKV's window attention at four budgets, H2O's accumulated attention) is computed once per layer
and shared by the selections that read it (kernel_memo.py). What a selection's method raises is
handed back with it (`errors`); the others go on.

Methods that score the whole prompt after the forward (KVzip's reconstruction forwards) score the shared
full cache once per method configuration: their scores do not depend on the budget, so the KVzip items of a
sample at three budgets pay one scoring pass, not three, and each selects its own budget from a copy of the
scores. Quantizers (KIVI, compositions ending in one) store their selection the quantized way after the
forward, as generation.prefill does. Methods that change the forward itself (kvpress presses, chunked
prefills, storages that read the prompt's last queries: capabilities.PREFILLS_ALONE) cannot share it;
`can_share_prefill` says which. The results equal generation.prefill's bit for bit: the same layer inputs
and the same full cache reach the same method code.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch

from ..core.base import Method
from ..core.budget import FULL_CACHE, Budget
from ..core.capabilities import Capability, prefills_alone
from ..core.errors import MethodError
from ..core.full import Full
from ..attention.families import check_family, decoder_layers, rotary_embedding, sliding_windows
from .budget_plan import compressed_length, plan_budget
from .generation import PrefilledPrompt, prefill
from .prompt_forward import check_request, forward, is_uneven, store_quantized
from ..attention.prefill_compression import compress_window, layer_selection, store_selection
from ..core.kernel_memo import KernelMemo
from ..attention.attention_hooks import AttentionCall, after_attention, projected_queries
from ..storage.window_layer import keep_window
from ..core.layout import COMPRESS, SLIDING
from ..adapters.transformers_compat import DynamicCache, DynamicLayer
from ..adapters.mixed_cache import is_state_layer, new_cache
from ..core.clock import now


def can_share_prefill(method: Method) -> bool:
    """Whether the method selects from a plain forward's layer inputs or its full cache (and so can share
    one). Methods that prefill in chunks, compress through their own hooks (kvpress presses), read the
    prompt's last queries for their storage (ThinK), compress while decoding or after each turn run their
    own prefill (generation.prefill): capabilities.PREFILLS_ALONE."""
    return not prefills_alone(method.capabilities)


@dataclass
class SharedPrefill:
    reference: PrefilledPrompt  # the full cache of the prompt
    selections: list[PrefilledPrompt]  # one compressed cache per requested (method, budget)
    forward_s: float  # the shared forward, the selections' own work excluded
    own_s: list[float] = field(default_factory=list)  # per selection: its compression (+ its question pass)
    errors: list[BaseException | None] = field(default_factory=list)  # per selection: what its method raised
    # per selection: the earlier one whose cache it equals, its own left None (a caller that prefills such requests
    # once: pytest_kvbench/engine/twins.py); empty: every selection is its own
    twin_of: list[int | None] = field(default_factory=list)


@dataclass
class _Selection:
    method: Method
    layer_budgets: list[int]
    cache: DynamicCache = field(default_factory=DynamicCache)
    kept: list = field(default_factory=list)
    seconds: float = 0.0
    scoring_s: float = 0.0  # of seconds: its share of a whole-prompt scoring pass (KVzip)
    error: BaseException | None = None  # what the method raised: the others go on without it


def _adopt(cache: DynamicCache, layer_idx: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Make layer `layer_idx` of `cache` refer to the full layer's tensors (no copy)."""
    while len(cache.layers) <= layer_idx:
        cache.layers.append(DynamicLayer())
    layer = cache.layers[layer_idx]
    layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values


@contextmanager
def _selecting_hooks(model, full: DynamicCache, selections: list[_Selection]):
    """While active, after each attention module every selection takes its kept positions of that layer."""
    rotary = rotary_embedding(model)

    def select(call: AttentionCall) -> None:
        layer_idx = call.layer_idx
        keys, values = full.layers[layer_idx].keys, full.layers[layer_idx].values
        queries = projected.take(call)
        memo = KernelMemo()  # budget-independent scoring, computed once for the layer's selections
        for number, selection in enumerate(selections):
            n_keep = selection.layer_budgets[layer_idx]
            # whole-prompt scorers select after the forward (_select_from_whole_prompt)
            if selection.error is not None or Capability.SCORES_WHOLE_PROMPT in selection.method.capabilities:
                continue
            sliding = call.layout is not None and call.layout.kind == SLIDING
            if n_keep >= keys.shape[-2] and not (sliding and min(selection.layer_budgets) < keys.shape[-2]):
                _adopt(selection.cache, layer_idx, keys, values)
                continue
            started = now()
            memo.user = number
            if sliding:  # kept as its window (a copy of the full layer's), as compressing_prefill does
                _adopt(selection.cache, layer_idx, keys, values)
                selection.kept[layer_idx] = keep_window(selection.cache, layer_idx, call.layout.window)
                if selection.method.sliding_layers == COMPRESS:  # and compressed within it
                    try:
                        selection.kept[layer_idx] = compress_window(selection.cache, call, selection.method, n_keep,
                                                                    queries, rotary, memo)
                    except Exception as exc:  # noqa: BLE001 - handed back with the selection, raised by its owner
                        selection.error, selection.cache = exc, DynamicCache()
                    selection.seconds += now() - started - memo.computing_seconds(number)
                continue
            # its own copy of the layer: a method that writes into what it reads harms only itself
            own_keys, own_values = keys.clone(), values.clone()
            _adopt(selection.cache, layer_idx, own_keys, own_values)
            own_call = call if call.captured_keys is None else \
                replace(call, captured_keys=call.captured_keys.clone(), captured_values=call.captured_values.clone())
            try:
                kept = layer_selection(selection.method, own_call, selection.cache.layers[layer_idx], n_keep, queries,
                                       rotary, memo)
                selection.kept[layer_idx] = store_selection(selection.cache, layer_idx, selection.method, kept,
                                                            n_keep)
            except Exception as exc:  # noqa: BLE001 - handed back with the selection, raised by its owner
                selection.error, selection.cache = exc, DynamicCache()
            selection.seconds += now() - started - memo.computing_seconds(number)
        for number, seconds in memo.shares().items():  # shared kernels: each user pays its share
            selections[number].seconds += seconds

    with projected_queries(model) as projected, after_attention(model, select):
        yield


@dataclass
class _WholePromptScores:
    scores: list[torch.Tensor]  # per layer [batch, kv_heads, T]
    seconds: float
    users: list[int] = field(default_factory=list)


def _select_from_whole_prompt(model, full: DynamicCache, selections: list[_Selection], ids: list[int]) -> None:
    """Every whole-prompt scorer's selection from the full cache of the context `ids`. One scoring pass per
    method configuration (its repr: same class and parameters) serves all its budgets, each selecting from its
    own copy of the scores and of the full layers; the pass's seconds are split among its users. The full
    cache is the forward's again afterwards, whatever a method raised."""
    context_len = len(ids)
    if not any(Capability.SCORES_WHOLE_PROMPT in s.method.capabilities and s.error is None for s in selections):
        return
    input_ids = torch.tensor([ids], dtype=torch.long, device=full.layers[0].keys.device)
    scored: dict[str, _WholePromptScores] = {}
    for number, selection in enumerate(selections):
        method = selection.method
        if Capability.SCORES_WHOLE_PROMPT not in method.capabilities or selection.error is not None:
            continue
        if min(selection.layer_budgets) >= context_len:  # keeps everything, as prefill() does
            for layer_idx, layer in enumerate(full.layers):
                _adopt(selection.cache, layer_idx, layer.keys, layer.values)
            continue
        started, computing = now(), 0.0
        saved = [(layer.keys, layer.values) for layer in full.layers]
        across_layers = Capability.SHARES_ACROSS_LAYERS in method.capabilities
        try:
            entry = scored.get(repr(method))
            if entry is None:
                method_started = now()
                entry = scored[repr(method)] = _WholePromptScores(method.prefill_scores(model, full, input_ids), 0.0)
                computing = entry.seconds = now() - method_started
            entry.users.append(number)
            chosen = method.select_layers([layer_scores.clone() for layer_scores in entry.scores],
                                          selection.layer_budgets)
            for layer_idx, ((keys, values), kept) in enumerate(zip(saved, chosen)):
                _adopt(selection.cache, layer_idx, keys.clone(), values.clone())
                n_keep = None if across_layers else selection.layer_budgets[layer_idx]
                selection.kept[layer_idx] = store_selection(selection.cache, layer_idx, method, kept, n_keep)
        except Exception as exc:  # noqa: BLE001 - handed back with the selection, raised by its owner
            selection.error, selection.cache = exc, DynamicCache()
        finally:
            for layer, (keys, values) in zip(full.layers, saved):
                layer.keys, layer.values = keys, values
        own = now() - started - computing
        selection.seconds += own
        selection.scoring_s += own
    for entry in scored.values():  # one pass, shared: each user pays its share
        for number in entry.users:
            selections[number].seconds += entry.seconds / len(entry.users)
            selections[number].scoring_s += entry.seconds / len(entry.users)


def _copy_states(full: DynamicCache, selections: list[_Selection]) -> None:
    """Each selection's own copy of the linear-attention layers' state: the same for every selection (the forward
    is), and updated in place by every later forward."""
    for layer_idx, layer in enumerate(full.layers):
        if is_state_layer(layer):
            for selection in selections:
                if selection.error is None:
                    selection.cache.layers[layer_idx] = copy.deepcopy(layer)


def _store_quantized_selections(model, selections: list[_Selection]) -> None:
    """Quantizers store their selection (or the whole prompt) their own way, after the forward."""
    for selection in selections:
        if Capability.OWN_STORAGE in selection.method.capabilities and selection.error is None:
            started = now()
            try:
                store_quantized(selection.method, selection.cache, {}, sliding_windows(model))
            except Exception as exc:  # noqa: BLE001 - handed back with the selection, raised by its owner
                selection.error, selection.cache = exc, DynamicCache()
            selection.seconds += now() - started


@torch.inference_mode()
def shared_prefill(model, requests: list[tuple[Method, Budget]], input_ids: list[int], context_len: int,
                   protocol: str, total_tokens: int | None = None) -> SharedPrefill:
    """The full-cache prefill of the prompt and, from the same forward, each request's compressed prefill
    (what generation.prefill(model, method, budget, ...) returns for it, bit for bit)."""
    input_ids = [int(token) for token in input_ids]
    full_method = Full.from_params()
    for method, _ in requests:
        check_request(method, input_ids, context_len, protocol)
        if not can_share_prefill(method):
            raise MethodError(f"{method.name} changes the prefill forward and cannot share it")
        if method.capabilities & (Capability.COMPRESSES | Capability.OWN_STORAGE):
            check_family(model, method, total_tokens or len(input_ids))
    compressed_len = compressed_length(len(input_ids), context_len, protocol)
    if compressed_len == 0:  # nothing to compress: every request is a plain prefill
        started = now()
        plain = [prefill(model, full_method, FULL_CACHE, input_ids, context_len, protocol)]
        plain += [prefill(model, m, b, input_ids, context_len, protocol, total_tokens) for m, b in requests]
        return SharedPrefill(plain[0], plain[1:], now() - started, [0.0] * len(requests),
                             [None] * len(requests))
    n_layers = len(decoder_layers(model))
    plans = [plan_budget(model, method, budget, len(input_ids), context_len, protocol) for method, budget in requests]
    selections = [_Selection(plan.method, plan.layer_budgets, new_cache(model), kept=[None] * n_layers)
                  for plan in plans]
    full = new_cache(model)
    started = now()
    with _selecting_hooks(model, full, selections):
        logits = forward(model, full, input_ids[:compressed_len], 0, False, 1)
    forward_s = now() - started - sum(s.seconds for s in selections)
    _copy_states(full, selections)
    _select_from_whole_prompt(model, full, selections, input_ids[:compressed_len])
    _store_quantized_selections(model, selections)
    reference_logits = logits
    if compressed_len < len(input_ids):
        started = now()
        reference_logits = forward(model, full, input_ids[compressed_len:], compressed_len, False, 1)
        forward_s += now() - started
    states = []
    for selection in selections:
        if selection.error is not None:
            states.append(None)
            continue
        uneven = is_uneven(selection.cache)
        next_logits = logits
        if compressed_len < len(input_ids):
            started = now()
            next_logits = forward(model, selection.cache, input_ids[compressed_len:], compressed_len, uneven, 1)
            selection.seconds += now() - started
        states.append(PrefilledPrompt(selection.cache, next_logits[-1], len(input_ids), uneven, selection.kept,
                                      selection.scoring_s))
    reference = PrefilledPrompt(full, reference_logits[-1], len(input_ids), False, [None] * n_layers)
    return SharedPrefill(reference, states, forward_s, [s.seconds for s in selections],
                         [s.error for s in selections])
