"""Multi-turn: one context, k turns; every question and the model's own answer stay in the cache.

SCBench (Li et al. 2024, arXiv 2412.10319) runs shared contexts as multi-turn sessions and shows
sub-linear-memory methods collapsing there. The context is prefilled and compressed once
(generation.prefill, query_agnostic); turn k's question is prefilled on the cache that already holds
the earlier questions and answers, and the answer is decoded greedily. A method that compresses while
decoding (decoding_compression.py) compresses again during every turn's answer; a method with
`per_turn=true` (per_turn.py) is cut back to its budget after every turn, from the turn's own queries.

Fidelity runs a second session on a copy of the compressed context: the reference's questions and answers
go in (teacher forcing), so each turn is compared with the full cache under the same history.

``keep_answers=False`` is SCBench's default, gold-answer history (MInference scbench/eval_utils.py,
GreedySearch._decode: decoding does not update the global cache): each answer is dropped once decoded,
and the caller's next turn carries the reference answer of this one in its tokens.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys

import torch

from ...core.base import Method
from ...core.budget import Budget
from ...core.capabilities import REWRITES_WHILE_DECODING, Capability
from .cache_snapshot import CacheSnapshot
from ...decoding.decoding_compression import compressing_decode
from ..generation import GenerationOutput, PrefilledPrompt, teacher_force_prefilled, measured_prefill, prefill
from ..prompt_forward import is_uneven
from .shared_context import ask, decode_answer
from ...core.clock import now


@torch.inference_mode()
def run_turns(model, method: Method, budget: Budget | str, context: list[int], turns: list[list[int]],
              max_new_tokens: int, eos_token_ids: set[int], *, return_logprobs: bool = False,
              teacher_targets: list[list[int]] | None = None, keep_answers: bool = True) -> list[GenerationOutput]:
    """One output per turn. Turn k sees context + q1 + a1 + ... + qk, where ai are the generated tokens
    (the stopping eos is not kept); prompt_tokens counts that whole history. ``return_logprobs``: every
    decoding step's distribution (the reference of fidelity). ``teacher_targets[k]`` (the reference's
    answer of turn k, its stopping eos included) is teacher-forced in a session of its own on a copy of
    the compressed context that holds the reference's history: out.target_logprobs.
    ``keep_answers=False``: turn k sees context + q1 + ... + qk only (each qk then holds the history the
    caller wants, such as the previous turn's gold answer): every answer leaves the cache once decoded."""
    context = [int(token) for token in context]
    eos = {int(token) for token in (eos_token_ids or ())}
    total = len(context) + sum(len(q) for q in turns) + len(turns) * max_new_tokens
    started = now()
    state = prefill(model, method, budget, context, len(context), "query_agnostic", total)
    context_s = now() - started
    forced = None if teacher_targets is None else dataclasses.replace(state, cache=copy.deepcopy(state.cache))
    outputs = []
    pending: list[int] = []  # the previous answer's last token when decoding did not feed it back
    forced_pending: list[int] = []
    for index, question in enumerate(turns):
        fed = pending + [int(token) for token in question]
        started = now()
        with turn_scope(model, method, state, len(fed)):
            state = ask(model, state, fed)
            out = measured_prefill(model, method, state, state.next_position,
                                   context_s + now() - started)
            with answering(state, method, keep_answers) as answered:
                decode_answer(model, method, answered, out, max_new_tokens, eos, return_logprobs)
            cut_started = now()
        out.decode_s += now() - cut_started  # per_turn's cut back at the scope's exit: the turn's work
        state.uneven = state.uneven or is_uneven(state.cache)
        context_s = 0.0
        pending = out.tokens[-1:] if out.stop_token is None and keep_answers else []  # an eos stop fed every token
        if forced is not None:
            target = [int(token) for token in teacher_targets[index]]
            forced, out.target_logprobs, forced_pending = forced_turn(
                model, method, forced, forced_pending + [int(token) for token in question], target, eos, keep_answers)
        outputs.append(out)
    return outputs


def forced_turn(model, method: Method, state: PrefilledPrompt, fed: list[int], target: list[int],
                eos: set[int], keep_answers: bool = True) -> tuple[PrefilledPrompt, torch.Tensor, list[int]]:
    """One turn of the teacher-forced session: `fed` goes in, then `target` (the reference's answer) is
    teacher-forced; (the session's state, target log-probs, the token to feed before the next question).
    Without `keep_answers` the target leaves the cache again, as the decoded answer does."""
    with turn_scope(model, method, state, len(fed)):
        state = ask(model, state, fed)
        snapshot = None if keep_answers else CacheSnapshot.take(state.cache)
        logprobs = teacher_force_prefilled(model, state, target)
        if snapshot is not None:
            snapshot.restore(state.cache)
    state.uneven = state.uneven or is_uneven(state.cache)
    if not keep_answers:
        return state, logprobs, []
    state.next_position += max(len(target) - 1, 0)
    return state, logprobs, (target[-1:] if target and target[-1] not in eos else [])


@contextlib.contextmanager
def answering(state: PrefilledPrompt, method: Method, keep_answers: bool):
    """The state to decode a turn's answer on. Without `keep_answers` the answer then leaves the cache:
    it is cut back to its snapshot and the position rewound, or, for a method that rewrites the cache
    while decoding (decoding_compression.py, per_turn), the answer is decoded on a copy of the cache."""
    if keep_answers:
        yield state
    elif method.capabilities & REWRITES_WHILE_DECODING:
        yield dataclasses.replace(state, cache=copy.deepcopy(state.cache))
    else:
        snapshot, position = CacheSnapshot.take(state.cache), state.next_position
        yield state
        snapshot.restore(state.cache)
        state.next_position = position


def turn_scope(model, method: Method, state: PrefilledPrompt, fed: int):
    """Around one turn (question and answer): with `per_turn`, the cache is cut back to its budget when the
    turn ends, the turn's queries scoring (a scorer window longer than the `fed` question tokens shrinks)."""
    if Capability.RECOMPRESSES_PER_TURN not in method.capabilities:
        return contextlib.nullcontext()
    scorer = method.observing(fed) if hasattr(method, "observing") else method
    return compressing_decode(model, state, scorer, sys.maxsize, cut_at_exit=True)
