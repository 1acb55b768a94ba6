"""A method built around another one: selection is the inner method's, the wrapper changes one thing.

Composition (composition.py: the kept tokens stored by a quantizer) and chunked prefill (chunked.py: the
prompt prefilled a chunk at a time) both leave the choice of kept tokens to the method they wrap; this
base forwards every selection hook to it, so each wrapper states only what it changes. It has the inner
method's capabilities but LAYER_SCORES (it forwards kept_indices, not score: no wrapper can reuse its scores).
"""

from __future__ import annotations

import torch

from ..core.base import Method
from ..core.capabilities import Capability


class Delegating(Method):
    """Forwards selection and storage to `inner`; subclasses set `name` and `params()`."""

    def __init__(self, inner: Method, name: str):
        self.inner, self.name = inner, name
        self.capabilities = inner.capabilities & ~Capability.LAYER_SCORES
        self.query_window = inner.query_window
        self.prefill_chunk = inner.prefill_chunk

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, {self.params()})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and (self.name, self.params()) == (other.name, other.params())

    def params(self) -> dict:
        return self.inner.params()

    def layer_budgets(self, budget_tokens: int, num_layers: int, prompt_len: int) -> list[int]:
        return self.inner.layer_budgets(budget_tokens, num_layers, prompt_len)

    def kept_indices(self, layer, n_keep: int) -> torch.Tensor:
        return self.inner.kept_indices(layer, n_keep)

    def kept_values(self, keys: torch.Tensor, values: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        return self.inner.kept_values(keys, values, kept)

    def select_layers(self, scores: list[torch.Tensor], layer_budgets: list[int]) -> list[torch.Tensor]:
        return self.inner.select_layers(scores, layer_budgets)

    def prefill_scores(self, model, cache, input_ids: torch.Tensor) -> list[torch.Tensor]:
        return self.inner.prefill_scores(model, cache, input_ids)

    def prefill_context(self, model, budget_tokens: int, prompt_len: int, ratio: float | None):
        return self.inner.prefill_context(model, budget_tokens, prompt_len, ratio)

    def masked_tokens_per_head(self, model, cache):
        return self.inner.masked_tokens_per_head(model, cache)

    def storage_layer(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor | None = None):
        return self.inner.storage_layer(keys, values, queries)

    def stored_bytes(self, tokens: int, heads: int, head_dim: int, element_size: int) -> int:
        return self.inner.stored_bytes(tokens, heads, head_dim, element_size)
