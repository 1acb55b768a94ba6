"""A group's prefilled caches decoded together: one batched forward per step for every member that can batch.

After a shared prefill (shared_prefill.py) each member of a sample holds its own compressed cache of the same
prompt. Decoding them one after another runs the model's weights once per member and token, at batch 1, where
an accelerator (and, less so, a CPU) is mostly idle. `generate_batch` decodes them in one batch instead:

- the members' caches become one `storage.batched.BatchedLayer` per layer (padded, masked per member and KV
  head), plugged into a transformers `DynamicCache`; each layer's attention gets its boolean mask through a
  pre-hook on the attention module (attention_hooks.attention_masks), the model's forward is never replaced;
- new tokens keep their true positions (position_ids per member: the same for every member of a sample, and
  per row when members of several samples, whose prompts differ in length, share a batch);
- the teacher-forced pass of fidelity (the reference's output fed to every member) costs nothing for a member
  whose greedy output is the reference's: its decoding was fed exactly those tokens, so its decoding steps are
  the teacher-forced rows; the members whose output differs are teacher-forced in one batched forward over
  the targets, after the decoding (no per-member deepcopy of the cache). Each member has its own targets
  (`BatchRequest.teacher_targets`, its sample's reference) or they come from rows decoded in the same batch
  (`targets_of`: a sample's full-cache reference decoded beside the members, whose greedy decoding does not
  depend on it); targets of different lengths are padded after their end (causal: the padding changes no
  real row), except for member layers (KIVI quantizes by how many tokens arrive), teacher-forced per length;
- a member stops at an eos or max_new_tokens, the others go on; stopped members leave the batch once half its
  rows have stopped (leaving copies the batch's buffers, so not at every stop; until then a stopped row is
  computed and ignored, its outputs unchanged).

Greedy tokens equal sequential decoding's (`generation.generate(..., prefilled=state)`) up to float rounding
of a different batch shape, which can flip a near-tie; tests/kvmethods/test_batched_decode.py checks every
built-in method. Timing rule: a step's wall time is shared equally among the members in that step, so each
member's `decode_s` is its share of the steps it took part in, and the members' decode_s add up to the
batch's decoding time. Which methods can batch is a capability (`capabilities.decodes_alone`): those that
compress while decoding, store their cache their own way (quantizers, ThinK) or declare DECODES_ALONE decode
alone (generation.generate), as does a cache holding a layer of another class. Storages of their own (KIVI,
ThinK: `CompactLayer`) batch with each other, each member's layers updated on its own row (batched.MemberLayers).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ..core.base import Method
from ..core.budget import Budget
from ..core.capabilities import decodes_alone
from ..core.errors import MethodError
from ..attention.model_probe import describe
from ..attention.gqa_attention import decoding_cache_dtype, masked_gqa
from ..attention.attention_hooks import AttentionCall, attention_masks
from ..storage.window_layer import WindowLayer
from ..storage.batched import BatchedLayer, MemberBuffer, MemberLayers, can_batch, can_batch_as_members
from ..adapters.mixed_cache import (cache_of_layers, is_state_layer, keep_state_rows, resumes_stepwise,
                                    stacked_state, token_layers)
from ..adapters.transformers_compat import DynamicCache, attention_implementation, cache_argument
from ..core.clock import now
from .generation import GenerationOutput, PrefilledPrompt, byte_allowance, measured_prefill
from .prompt_forward import cached_forward_kernels


# targets_of(outputs) -> per request, the targets it is teacher-forced on (None: none), once decoding is done
TargetsOf = Callable[[list[GenerationOutput]], list[list[int] | None]]


@dataclass
class BatchRequest:
    """One member of a batch: its method and budget, and the cache its prefill made."""

    method: Method
    budget: Budget | None
    state: PrefilledPrompt
    prompt_tokens: int | None = None  # its prompt's length (members of several samples); None: generate_batch's
    teacher_targets: list[int] | None = None  # its own targets (its sample's reference); None: generate_batch's


PADDED = "padded"  # dense and ragged caches: one padded copy (BatchedLayer)
MEMBERS = "members"  # caches stored their own way (quantized, thin keys): each member's layers (MemberLayers)


def batch_kind(method: Method, state: PrefilledPrompt) -> str | None:
    """Which batches a member can join: PADDED (every layer plain dense or ragged), MEMBERS (every layer a
    storage of its own, CompactLayer) or None: it decodes alone (its capabilities say so, or its cache mixes
    kinds or holds a layer of another class)."""
    if decodes_alone(method.capabilities):
        return None
    layers = token_layers(state.cache)  # a linear layer's state joins either batch, stacked (mixed_cache.py)
    if all(can_batch(layer) for layer in layers):
        return PADDED
    if all(can_batch_as_members(layer) or isinstance(layer, WindowLayer) for layer in layers) and \
            any(can_batch_as_members(layer) for layer in layers):  # sliding layers' windows: padded, the rest members
        return MEMBERS
    return None


def can_decode_in_batch(method: Method, state: PrefilledPrompt) -> bool:
    """Whether a member decodes in a batch (of its batch_kind)."""
    return batch_kind(method, state) is not None


def batched_cache(states: list[PrefilledPrompt], room: int, windows: list[int | None] | None = None,
                  dtype: torch.dtype | None = None) -> DynamicCache:
    """The members' caches as one batch: padded into BatchedLayers (the members' caches stay as they are) or,
    for storages of their own, MemberLayers over forks of the members' layers (which decoding changes; a fork
    shares the stored codes, CompactLayer.fork) each reading into its layer's MemberBuffer (the batch's working
    memory, kept between steps, with `room` for the new tokens), their sliding layers' windows (full precision)
    padded. `windows`: each layer's sliding window (a dense member's sliding layer too). `dtype`: the padded
    buffers' and the working memory's, where not the members' (a decoding batch's float32 copy:
    gqa_attention.decoding_cache_dtype). Linear layers' states are stacked along the batch axis
    (mixed_cache.stacked_state)."""
    n_layers = len(states[0].cache.layers)
    members = [[s.cache.layers[i] for s in states] for i in range(n_layers)]
    if all(can_batch(layer) for s in states for layer in token_layers(s.cache)):
        if windows is None or len(windows) != n_layers:  # each layer's sliding window (a dense member's too)
            windows = [None] * n_layers
        layers = [stacked_state(of) if is_state_layer(of[0]) else BatchedLayer(of, room, windows[i], dtype)
                  for i, of in enumerate(members)]
    else:
        windows = windows if windows is not None and len(windows) == n_layers else [None] * n_layers
        layers = [stacked_state(of) if is_state_layer(of[0])
                  else BatchedLayer(of, room, windows[i], dtype) if all(map(can_batch, of))  # sliding windows
                  else MemberLayers([layer.fork() for layer in of], MemberBuffer(room, dtype))
                  for i, of in enumerate(members)]
    return cache_of_layers(states[0].cache, layers)


def _windows(model) -> list[int | None] | None:
    """Each decoder layer's sliding window (None: global), from the family's description; None when the model has
    no description kvmethods can read (the full-cache reference of a family it cannot compress: no window known)."""
    try:
        return [layer.window for layer in describe(model).layers]
    except MethodError:
        return None


@contextmanager
def _batch_masks(model, cache: DynamicCache):
    """The batch's masks, boolean for sdpa; additive for the others (eager adds the mask to the scores: gemma2,
    gpt-oss), as the sequential road's per-layer masks are."""
    boolean = attention_implementation(model) == "sdpa"

    def mask_for(call: AttentionCall) -> torch.Tensor:
        visible = cache.layers[call.layer_idx].attention_mask(call.hidden.shape[1],
                                                              call.module.config.num_attention_heads)
        if boolean:
            return visible
        dtype = call.hidden.dtype
        return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill_(~visible, torch.finfo(dtype).min)

    # no repeat_kv in the teacher-forced forward, rows attending in groups by length (CPU)
    with masked_gqa(model, cache), attention_masks(model, mask_for):
        yield


def _forward(model, cache: DynamicCache, tokens: torch.Tensor, positions: torch.Tensor, logits_to_keep: int):
    """tokens, positions [B, q] -> logits [B, q or 1, vocab], inside _batch_masks(model, cache)."""
    if tokens.shape[1] > 1 and resumes_stepwise(cache):  # transformers 5.2's linear attention (prompt_forward.forward)
        rows = [_forward(model, cache, tokens[:, i:i + 1], positions[:, i:i + 1], 1) for i in range(tokens.shape[1])]
        return rows[-1] if logits_to_keep == 1 else torch.cat(rows, dim=1)
    with cached_forward_kernels(model, cache.get_seq_length()):  # no cuDNN graphs
        return model(input_ids=tokens, position_ids=positions, use_cache=True, logits_to_keep=logits_to_keep,
                     **cache_argument(model, cache)).logits


def _teacher_force(model, cache: DynamicCache, states: list[PrefilledPrompt], targets: list[list[int]],
                   positions: torch.Tensor) -> list[torch.Tensor]:
    """Each member's [len(its targets), vocab] float32 log-probs of its targets (generation.teacher_force_prefilled,
    for the whole batch in one forward); the targets stay in the cache. Shorter targets are padded after their
    end (token 0): attention is causal, so the padding changes none of a row's real positions."""
    first = [torch.log_softmax(s.next_logits.float(), dim=-1).unsqueeze(0) for s in states]
    longest = max(len(t) for t in targets)
    if longest <= 1:
        return [row[: len(t)] for row, t in zip(first, targets)]
    device = positions.device
    fed = [list(t[:-1]) + [0] * (longest - max(len(t), 1)) for t in targets]
    tokens = torch.tensor(fed, dtype=torch.long, device=device)
    steps = positions + torch.arange(longest - 1, device=device)
    with _batch_masks(model, cache):
        logits = _forward(model, cache, tokens, steps, 0)
    return [torch.cat([first[b], torch.log_softmax(logits[b, : max(len(t) - 1, 0)].float(), dim=-1)])[: len(t)]
            for b, t in enumerate(targets)]


def _kept(state: PrefilledPrompt) -> int:
    """Tokens a member's cache keeps, its longest KV head per layer, summed over the layers."""
    return sum(max(getattr(layer, "tokens_per_head", lambda: [layer.keys.shape[-2]])())
               for layer in token_layers(state.cache))


@torch.inference_mode()
def generate_batch(model, requests: list[BatchRequest], prompt_tokens: int | None, max_new_tokens: int, eos: set[int],
                   *, teacher_targets: list[int] | None = None, return_logprobs: bool = False,
                   targets_of: TargetsOf | None = None) -> list[GenerationOutput]:
    """What generation.generate(model, method, budget, ..., prefilled=state) returns for each request (tokens,
    stop token, sizes measured before decoding, target_logprobs with teacher targets, per-step log-probs with
    return_logprobs), decoded in one batch; `decode_s` is each member's share of the batched steps.

    A request's own prompt_tokens and teacher_targets win over the arguments (members of several samples);
    `targets_of(outputs)`, called once the decoding is done, gives each request's targets instead (None: no
    teacher-forced pass), e.g. its sample's reference decoded as another row of the same batch.

    The rows are ordered longest cache first, so that consecutive rows have similar lengths in most layers and a
    padded batch's attention can take them in groups (BatchedLayer.buckets); the outputs come in request order."""
    order = sorted(range(len(requests)), key=lambda number: -_kept(requests[number].state))
    back = sorted(range(len(order)), key=order.__getitem__)  # request -> its row

    def sorted_targets(outputs: list[GenerationOutput]) -> list[list[int] | None]:
        targets = targets_of([outputs[back[number]] for number in range(len(order))])
        return [targets[number] for number in order]

    outputs = _generate_rows(model, [requests[number] for number in order], prompt_tokens, max_new_tokens, eos,
                             teacher_targets, return_logprobs, None if targets_of is None else sorted_targets)
    return [outputs[back[number]] for number in range(len(order))]


def _generate_rows(model, requests: list[BatchRequest], prompt_tokens: int | None, max_new_tokens: int, eos: set[int],
                   teacher_targets: list[int] | None, return_logprobs: bool,
                   targets_of: TargetsOf | None) -> list[GenerationOutput]:
    """generate_batch, the requests in their batch rows' order."""
    states = [r.state for r in requests]
    outputs = []
    for request in requests:  # measured before the batch: what each member's own cache holds
        tokens = request.prompt_tokens if request.prompt_tokens is not None else prompt_tokens
        out = measured_prefill(model, request.method, request.state, tokens, 0.0)
        if request.budget is not None and request.budget.kind == "memory":
            out.kv_bytes_budget = byte_allowance(request.budget, out)
        outputs.append(out)
    own_targets = [r.teacher_targets if r.teacher_targets is not None else teacher_targets for r in requests]
    forcing = targets_of is not None or any(t is not None for t in own_targets)
    room = max([max_new_tokens] + [len(t) for t in own_targets if t is not None])
    # a copy only decoding steps read: where a step attends in float32, it holds float32 keys and values
    cache = batched_cache(states, room, _windows(model), decoding_cache_dtype(model))
    device = token_layers(cache)[0].keys.device
    positions = torch.tensor([[s.next_position] for s in states], dtype=torch.long, device=device)
    keep_steps = return_logprobs or forcing
    steps: list[list[torch.Tensor]] = [[] for _ in requests]
    decode_s = [0.0] * len(requests)
    rows = list(range(len(requests)))  # the request in each batch row (None: stopped, still computed)
    logits = torch.stack([s.next_logits for s in states])
    with _batch_masks(model, cache):  # the mask hooks once for the whole decoding, not per step
        while True:
            chosen = logits.argmax(-1).tolist()
            for row, number in enumerate(rows):
                if number is None:
                    continue
                if keep_steps:
                    steps[number].append(torch.log_softmax(logits[row].float(), dim=-1))
                token = chosen[row]
                out = outputs[number]
                if token in eos:
                    out.stop_token = token
                else:
                    out.tokens.append(token)
                if token in eos or len(out.tokens) >= max_new_tokens:
                    rows[row] = None
            active = [number for number in rows if number is not None]
            if not active:
                break
            if 2 * len(active) <= len(rows):  # half the rows stopped: they leave (a copy of the buffers, not each time)
                keep = torch.tensor([row for row, number in enumerate(rows) if number is not None], device=device)
                for layer in cache.layers:
                    keep_state_rows(layer, keep) if is_state_layer(layer) else layer.keep_rows(keep)
                positions = positions[keep]
                rows = active
            started = now()
            tokens = torch.tensor([[outputs[number].tokens[-1] if number is not None else 0] for number in rows],
                                  dtype=torch.long, device=device)
            logits = _forward(model, cache, tokens, positions, 1)[:, -1]
            positions = positions + 1
            share = (now() - started) / len(active)  # the step's time, shared equally by the members still decoding
            for number in active:
                decode_s[number] += share
    del cache, logits
    if forcing:
        targets = list(targets_of(outputs) if targets_of is not None else own_targets)
        # member layers quantize as tokens arrive
        reuse = all(can_batch(layer) for s in states for layer in token_layers(s.cache))
        _teacher_forced_rows(model, states, outputs, steps, targets, device, reuse)
    for number, out in enumerate(outputs):
        out.decode_s = decode_s[number]
        out.logprobs = torch.stack(steps[number]) if return_logprobs else None
    return outputs


def _teacher_forced_rows(model, states: list[PrefilledPrompt], outputs: list[GenerationOutput],
                         steps: list[list[torch.Tensor]], targets: list[list[int] | None], device,
                         reuse: bool) -> None:
    """Each output's target_logprobs (none where its targets are None). A member whose greedy output (its stopping
    eos included) is the targets themselves was fed exactly the targets while decoding, so with `reuse` (a padded
    batch, whose caches change only by the tokens appended) its decoding steps are the teacher-forced rows (up to
    float rounding of a one-token forward). Not for member layers: KIVI quantizes the values leaving its window at
    every decoding step, while the teacher-forced forward feeds all targets at once, as
    generation.teacher_force_copy does. The others are teacher-forced in one batch of their own (member layers:
    one per targets length, as a member quantizes by how many tokens arrive)."""
    forced: dict[int, list[int]] = {}
    for number, out in enumerate(outputs):
        wanted = None if targets[number] is None else [int(t) for t in targets[number]]
        targets[number] = wanted
        if wanted is None:
            continue
        produced = out.tokens + ([out.stop_token] if out.stop_token is not None else [])
        if reuse and produced == wanted and wanted:
            out.target_logprobs = torch.stack(steps[number])
        elif len(wanted) <= 1:
            out.target_logprobs = torch.stack(steps[number][: len(wanted)]) if wanted else \
                states[number].next_logits.new_zeros(0, states[number].next_logits.shape[-1]).float()
        else:
            forced.setdefault(0 if reuse else len(wanted), []).append(number)
    for numbers in forced.values():
        chosen = [states[n] for n in numbers]
        wanted = [targets[n] for n in numbers]
        cache = batched_cache(chosen, max(map(len, wanted)), _windows(model))  # a dense sliding layer: its window
        positions = torch.tensor([[s.next_position] for s in chosen], dtype=torch.long, device=device)
        for number, logprobs in zip(numbers, _teacher_force(model, cache, chosen, wanted, positions)):
            outputs[number].target_logprobs = logprobs
