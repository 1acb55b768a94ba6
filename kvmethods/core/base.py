"""The Method base class: typed, validated parameters plus the selection contract.

A method decides which prompt positions each KV head of a layer keeps. During the compressed prefill
(see hooks.py) it is handed one layer at a time as a `LayerInputs` and answers with kept indices; it never
touches the model or the cache itself. Parameters are dataclass fields with documented defaults; values
from the CLI grid arrive as strings and are coerced by the field's annotated type, so `window="32"` works
and `window="wide"` is a MethodError naming the valid parameters.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from ..runtime.layer_inputs import LayerInputs
from .params import check_known, checked_values, declared_params, describe_params, param

__all__ = ["Method", "param", "top_positions"]  # param: declared in params.py, used by every method module


def top_positions(scores: torch.Tensor, n_keep: int) -> torch.Tensor:
    """Indices of the n_keep highest scores along the last axis, in ascending position order.
    Ties (frequent after max-pooling) go to the earlier position, on every device."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    return order[..., :n_keep].sort(dim=-1).values


@dataclass
class Method:
    """Base class of every compression method (built-in or third-party).

    Subclasses are dataclasses that set `name`, declare parameters with `param(...)`, and implement
    `score` (higher = keep; the base keeps the top n per KV head) or override `kept_indices`.
    """

    name: ClassVar[str] = ""
    compresses: ClassVar[bool] = True  # False only for the full-cache reference
    # True for methods that score from the whole prefilled cache (KVzip's reconstruction forward):
    # they implement prefill_scores() instead of score(), and compression happens after the prefill.
    scores_whole_prompt: ClassVar[bool] = False
    # True for adapters that compress through their own hooks (kvpress presses): prefill_context() wraps
    # the plain prefill forward instead of kvmethods' hooks.
    runs_prefill: ClassVar[bool] = False
    # False for methods that change the prefill forward itself (chunked eviction, compression while
    # decoding): they cannot take their selection from a forward shared with others (shared_prefill.py).
    shares_prefill: ClassVar[bool] = True
    # True for methods that change how the kept tokens are stored (KIVI): storage_layer() replaces each
    # layer of the cache once the prompt is compressed, and stored_bytes() gives its analytic size.
    quantizes: ClassVar[bool] = False
    query_window: ClassVar[int] = 0  # > 0: storage_layer() gets the prompt's last queries (ThinK)
    # True when the method is cut back to its budget after each turn of a multi-turn session (per_turn.py)
    recompresses_per_turn: ClassVar[bool] = False
    prunes_channels: ClassVar[bool] = False  # ThinK: a storage that thins keys, composable before a quantizer
    takes_channels: ClassVar[bool] = False  # quantizers whose storage_layer() can quantize thin keys (KIVI)

    def __post_init__(self) -> None:
        specs = declared_params(type(self))
        values = checked_values(self.name, specs, {spec.name: getattr(self, spec.name) for spec in specs})
        for name, value in values.items():
            setattr(self, name, value)
        self.check()

    def check(self) -> None:
        """Cross-parameter validation; raise MethodError."""

    @classmethod
    def describe_params(cls) -> str:
        return describe_params(declared_params(cls))

    @classmethod
    def from_params(cls, **kwargs: Any) -> Method:
        check_known(cls.name, declared_params(cls), kwargs)
        return cls(**kwargs)

    def params(self) -> dict:
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    def layer_budgets(self, budget_tokens: int, num_layers: int, prompt_len: int) -> list[int]:
        """Tokens kept by each layer; uniform unless a method allocates budgets across layers."""
        return [min(budget_tokens, prompt_len)] * num_layers

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        """[batch, num_kv_heads, T] importance of each prompt position (higher = keep)."""
        raise NotImplementedError(f"{type(self).__name__} must implement score() or kept_indices()")

    def prefill_scores(self, model, cache, input_ids: torch.Tensor) -> list[torch.Tensor]:
        """Per layer [batch, num_kv_heads, T] scores from the whole prefilled `cache` of `input_ids`
        ([batch, T]); only for methods with scores_whole_prompt."""
        raise NotImplementedError(f"{type(self).__name__} sets scores_whole_prompt but has no prefill_scores()")

    def prefill_context(self, model, budget_tokens: int, prompt_len: int, ratio: float | None):
        """Context manager around the prefill forward of a runs_prefill method; ratio is set for ratio budgets."""
        raise NotImplementedError(f"{type(self).__name__} sets runs_prefill but has no prefill_context()")

    def while_decoding(self, model, state):
        """Context manager around greedy decoding on a prefilled `state` (generation.PrefilledPrompt); it
        yields a list that a method compressing while decoding (decoding_compression.py) fills with the
        cache length after each step. The default compresses nothing and records nothing."""
        return contextlib.nullcontext([])

    def masked_tokens_per_head(self, model, cache) -> list[list[int]] | None:
        """Per layer and KV head, cached tokens that attention is made to ignore (masking without
        evicting, as kvpress' head-wise presses do); None when every cached token is attended."""
        return None

    def storage_layer(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor | None = None):
        """A transformers cache layer holding a compressed layer's keys/values [batch, heads, n, dim], or
        None to keep them as they are (every method but the quantizers). `queries`: with query_window,
        the layer's last prompt queries [batch, q_heads, w, dim]."""
        return None

    def stored_bytes(self, tokens: int, heads: int, head_dim: int, element_size: int) -> int:
        """Bytes one layer stores for `tokens` kept tokens per KV head (batch 1): what byte budgets
        (memory_budget.py) trade against tokens."""
        return 2 * tokens * heads * head_dim * element_size

    def select(self, scores: torch.Tensor, n_keep: int) -> torch.Tensor:
        """What to keep given [batch, num_kv_heads, T] scores: the top n_keep of each KV head (ties go to
        the earlier position). Head-adaptive methods (adakv) instead return a bool mask [batch,
        num_kv_heads, T] keeping num_kv_heads * n_keep positions per layer, shared unevenly among heads."""
        return top_positions(scores, n_keep)

    # True when select_layers shares the budget over all layers (adakv:across_layers over kvzip)
    shares_across_layers: ClassVar[bool] = False

    def select_layers(self, scores: list[torch.Tensor], layer_budgets: list[int]) -> list[torch.Tensor]:
        """select() per layer, for methods that score the whole prompt at once (scores_whole_prompt)."""
        return [self.select(layer_scores, n_keep) for layer_scores, n_keep in zip(scores, layer_budgets)]

    def kept_indices(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        """[batch, num_kv_heads, n_keep] positions to keep, ascending, distinct, all < T (or select()'s
        bool mask for head-adaptive methods)."""
        return self.select(self.score(layer, n_keep), n_keep)

    @classmethod
    def has_layer_scores(cls) -> bool:
        """Whether score() is implemented, i.e. another method can reuse this one's scores (adakv, criticalkv)."""
        return cls.score is not Method.score and not cls.scores_whole_prompt
