"""Twins: members of a sample's shared prefill whose compressed caches would be equal, prefilled and decoded once.

A grid crosses every method with every budget, and some crossings make the same cache twice: a quantizer that
keeps every token (KIVI, ThinK's storage) holds the same codes at m0.125 and at m0.25, and any method at budgets
that all keep the whole prompt keeps it whole each time. The same method code reading the same layer inputs and
keeping as many tokens per layer selects the same positions and stores the same tensors
(kvmethods.runtime.budget_plan.selection_key says what decides that), and greedy decoding of equal caches
teacher-forced on the same reference gives the same tokens, log-probs, KL and agreement. So the first of such
members is prefilled and decoded; the others ride with it (group_decode.py) and get a copy of its outcome, with
what depends on their own budget (a byte budget's allowance) made for their budget, and `twin_of` in their
sample rows naming the item whose decoding they share. Their timings are the decoding's own: what that cache's
prefill and decoding cost, which is what each twin would have paid alone. What it saves: docs/performance.md.
"""

from __future__ import annotations

import copy
from dataclasses import replace

from kvmethods import Budget
from kvmethods.runtime.budget_plan import selection_key
from kvmethods.runtime.generation import byte_allowance


def find_twins(model, requests: list[tuple], prompt, protocol: str) -> list[int | None]:
    """Per request (method, budget), the index of the earlier request whose cache it would equal, else None."""
    first: dict = {}
    twin_of: list[int | None] = []
    for index, (method, budget) in enumerate(requests):
        key = selection_key(model, method, budget, len(prompt.input_ids), prompt.context_len, protocol)
        original = index if key is None else first.setdefault(key, index)
        twin_of.append(None if original == index else original)
    return twin_of


def spread_to_twins(shared, own: list[int], twin_of: list[int | None]):
    """The shared prefill of the `own` requests, spread back over every request: a twin's selection is None, its
    compression time and error those of the request it rides with; `shared.twin_of` keeps the pairing."""
    count = len(twin_of)
    selections, own_s, errors = [None] * count, [0.0] * count, [None] * count
    for position, index in enumerate(own):
        selections[index] = shared.selections[position]
        own_s[index], errors[index] = shared.own_s[position], shared.errors[position]
    for index, original in enumerate(twin_of):
        if original is not None:
            own_s[index], errors[index] = own_s[original], errors[original]
    shared.selections, shared.own_s, shared.errors = selections, own_s, errors
    shared.twin_of = twin_of
    return shared


def twin_outcome(outcome, twin, original):
    """`original`'s outcome (sample_outcomes.DecodedSample) as its twin's: the same generation with the twin's
    byte-budget allowance, and `twin_of` naming the item whose decoding it shares."""
    result = copy.copy(outcome.result)
    budget = Budget.parse(twin.budget)
    result.kv_bytes_budget = byte_allowance(budget, result) if budget.kind == "memory" else None
    return replace(outcome, result=result, timing=outcome.timing | {"twin_of": original.id})
