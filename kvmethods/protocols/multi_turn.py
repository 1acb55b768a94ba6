"""Multi-turn: one context, k turns; every question and the model's own answer stay in the cache.

SCBench (Li et al. 2024, arXiv 2412.10319) runs shared contexts as multi-turn sessions and shows
sub-linear-memory methods collapsing there. The context is prefilled and compressed once
(generation.prefill, query_agnostic); turn k's question is prefilled on the cache that already holds
the earlier questions and answers, and the answer is decoded greedily. A method that compresses while
decoding (decoding_compression.py) compresses again during every turn's answer, so the history it keeps
stays within its budget.
"""

from __future__ import annotations

import time

import torch

from ..base import Method
from ..budget import Budget
from ..generation import GenerationOutput, decode_greedy, measured_prefill, prefill
from .shared_context import ask


@torch.inference_mode()
def run_turns(model, method: Method, budget: Budget | str, context: list[int], turns: list[list[int]],
              max_new_tokens: int, eos_token_ids: set[int]) -> list[GenerationOutput]:
    """One output per turn. Turn k sees context + q1 + a1 + ... + qk, where ai are the generated tokens
    (the stopping eos is not kept); prompt_tokens counts that whole history."""
    context = [int(token) for token in context]
    eos = {int(token) for token in (eos_token_ids or ())}
    total = len(context) + sum(len(q) for q in turns) + len(turns) * max_new_tokens
    started = time.perf_counter()
    state = prefill(model, method, budget, context, len(context), "query_agnostic", total)
    context_s = time.perf_counter() - started
    outputs = []
    pending: list[int] = []  # the previous answer's last token: decoding never feeds it back
    for question in turns:
        started = time.perf_counter()
        state = ask(model, state, pending + [int(token) for token in question])
        out = measured_prefill(model, method, state, state.next_position, context_s + time.perf_counter() - started)
        context_s = 0.0
        started = time.perf_counter()
        out.tokens, out.stop_token, _, out.decode_cache_lengths = decode_greedy(model, state, max_new_tokens, eos,
                                                                                 method=method)
        out.decode_s = time.perf_counter() - started
        pending = out.tokens[-1:]
        outputs.append(out)
    return outputs
