"""Shared context: compress a context once, answer each of its questions on top, restore between them.

kvpress evaluates query-agnostic compression this way (its FAQ: a question inside the compressed prompt
"artificially favors" SnapKV-like methods) and KVzip (Kim et al. 2025, arXiv 2505.23416) shows query-aware
eviction failing once one cache must serve several queries; SCBench's multi-request mode is the same
setting. The context is prefilled and compressed once (generation.prefill, query_agnostic); each question
is then prefilled uncompressed on that cache at its true positions, answered greedily, and the cache is
cut back to its compressed state (cache_snapshot.py), so no question sees another's tokens.
"""

from __future__ import annotations

import dataclasses

import torch

from ...core.base import Method
from ...core.budget import Budget
from ..generation import (GenerationOutput, PrefilledPrompt, decode_greedy, measured_prefill, prefill,
                          teacher_force_copy)
from ..prompt_forward import forward
from .cache_snapshot import CacheSnapshot
from ...core.clock import now


def ask(model, context: PrefilledPrompt, question: list[int]) -> PrefilledPrompt:
    """The context's cache with `question` prefilled (uncompressed) on top, ready to decode."""
    if not question:
        return dataclasses.replace(context)
    logits = forward(model, context.cache, question, context.next_position, context.uneven, 1)[-1]
    return dataclasses.replace(context, next_logits=logits, next_position=context.next_position + len(question))


@torch.inference_mode()
def answer_questions(model, method: Method, budget: Budget | str, context: list[int], questions: list[list[int]],
                     max_new_tokens: int, eos_token_ids: set[int], *, return_logprobs: bool = False,
                     teacher_targets: list[list[int]] | None = None) -> list[GenerationOutput]:
    """One output per question, in order. A question's prefill_s is its own prefill plus an equal share
    of the one context prefill and compression. ``return_logprobs``: each output keeps every decoding
    step's distribution (the reference of fidelity); ``teacher_targets[i]`` is teacher-forced on a copy of
    question i's cache (out.target_logprobs), as generate() does for one prompt."""
    context = [int(token) for token in context]
    eos = {int(token) for token in (eos_token_ids or ())}
    longest = max((len(q) for q in questions), default=0)
    started = now()
    state = prefill(model, method, budget, context, len(context), "query_agnostic",
                    len(context) + longest + max_new_tokens)
    context_share = (now() - started) / max(1, len(questions))
    compressed = CacheSnapshot.take(state.cache)
    outputs = []
    for index, question in enumerate(questions):
        started = now()
        asked = ask(model, state, [int(token) for token in question])
        out = measured_prefill(model, method, asked, len(context) + len(question),
                               context_share + now() - started)
        if teacher_targets is not None:
            out.target_logprobs = teacher_force_copy(model, asked, teacher_targets[index])
        decode_answer(model, method, asked, out, max_new_tokens, eos, return_logprobs)
        compressed.restore(state.cache)
        outputs.append(out)
    return outputs


def decode_answer(model, method: Method, state: PrefilledPrompt, out: GenerationOutput, max_new_tokens: int,
                  eos: set[int], return_logprobs: bool) -> None:
    """Greedy decoding on a question's cache into `out`: tokens, stop token, cache lengths, decode_s, logprobs."""
    started = now()
    out.tokens, out.stop_token, steps, out.decode_cache_lengths = decode_greedy(model, state, max_new_tokens, eos,
                                                                             return_logprobs, method)
    out.decode_s = now() - started
    out.logprobs = torch.stack(steps) if return_logprobs else None
