"""One budget plan: a method's budget for one prompt turned into the tokens each layer keeps.

A prompt is compressed alone (generation.prefill) or with other (method, budget) pairs from one shared
forward (shared_prefill.py), and both must keep the same tokens bit for bit. So going from a budget to
per-layer counts is written here once: which part of the prompt the protocol compresses, what the budget
allows that part (tokens, a ratio removed, or a fraction of the cache's bytes: memory_budget.operating_point,
which counts an uncompressed question against it), the method's split over layers (PyramidKV's pyramid),
the check of what the method returned, and what a method compressing while decoding cuts back to.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.base import Method
from ..core.budget import Budget
from ..core.capabilities import Capability
from ..core.errors import MethodError
from ..attention.families import decoder_layers, describe
from ..core.memory_budget import CacheGeometry, operating_point


def compressed_length(prompt_len: int, context_len: int, protocol: str) -> int:
    """The prompt tokens a protocol compresses: all of them (question_in_window) or the context only."""
    return prompt_len if protocol == "question_in_window" else context_len


@dataclass(frozen=True)
class BudgetPlan:
    """Per-layer counts of one (method, budget) on one prompt."""

    method: Method
    budget: Budget
    prompt_len: int
    compressed_len: int  # the tokens the protocol compresses (the rest is appended uncompressed)
    n_layers: int
    tokens: int  # tokens per layer the budget allows the compressed part, before the method's split
    # What each layer keeps of the compressed part: the method's split when it cuts anything, else all of it.
    layer_budgets: list[int]
    compresses: bool  # the method compresses and some layer keeps fewer than compressed_len tokens

    def decode_layer_budgets(self) -> list[int]:
        """What each layer is cut back to while decoding (methods compressing while decoding, per turn): the
        budget itself for token budgets (not capped at the prompt, which decoding outgrows), else the
        prompt's share."""
        target = int(self.budget.value) if self.budget.kind == "tokens" else self.tokens
        return self.method.layer_budgets(target, self.n_layers, max(target, self.compressed_len))


def token_layer_windows(model) -> list[int | None]:
    """Per layer holding a per-token cache (linear layers hold a fixed state, outside a byte budget's allowance),
    its sliding window, None for a global layer: what a byte budget's operating point counts."""
    return [layer.window for layer in describe(model).layers if layer.has_cache]


def plan_budget(model, method: Method, budget: Budget | str, prompt_len: int, context_len: int,
                protocol: str) -> BudgetPlan:
    """The plan of `method` at `budget` for a prompt of `prompt_len` tokens whose context is the first
    `context_len`; MethodError when the method's split is not one positive count per layer."""
    budget = Budget.parse(budget)
    compressed_len = compressed_length(prompt_len, context_len, protocol)
    n_layers = len(decoder_layers(model))
    if budget.kind == "memory":  # the whole prompt's bytes count, the uncompressed question included
        tokens = operating_point(method, budget, prompt_len, CacheGeometry.of(model), prompt_len - compressed_len,
                                 token_layer_windows(model))
    else:
        tokens = budget.tokens_for(compressed_len)
    split = method.layer_budgets(tokens, n_layers, compressed_len)
    compresses = Capability.COMPRESSES in method.capabilities and compressed_len > 0 and min(split) < compressed_len
    if compresses and (len(split) != n_layers or min(split) < 1):
        raise MethodError(f"{method.name}: layer_budgets must give {n_layers} positive counts, got {split}")
    layer_budgets = split if compresses else [compressed_len] * n_layers
    return BudgetPlan(method, budget, prompt_len, compressed_len, n_layers, tokens, layer_budgets, compresses)


def selection_key(model, method: Method, budget: Budget | str, prompt_len: int, context_len: int,
                  protocol: str) -> tuple | None:
    """What decides the cache a shared prefill makes for (method, budget) on this prompt: the method's
    configuration (its repr: class and parameters; and how it treats sliding-window layers) and each layer's
    count. Two requests with equal keys get equal caches, the same method code reading the same layer inputs
    and keeping as many tokens, so one prefill and one decoding can stand for both: a quantizer at two byte
    budgets that both hold its whole cache, or any method at budgets that all keep the whole prompt.
    None where the plan itself fails: that request's own prefill raises its error."""
    try:
        plan = plan_budget(model, method, budget, prompt_len, context_len, protocol)
    except MethodError:
        return None
    return repr(method), getattr(method, "sliding_layers", None), tuple(plan.layer_budgets), plan.compresses
