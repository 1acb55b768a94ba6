"""Methods that wrap another method's scores (adakv, criticalkv): the `base` parameter and its own parameters.

A wrapper names its base method by a string parameter (`adakv:base=snapkv`, or `base = "snapkv"` in a TOML
table), so grid files and the command line need no nested syntax. Parameters the wrapper does not declare
go to the base method (`adakv:base=snapkv:window=64`), and the record shows the base's parameters under
`base_params`. Only methods that score positions (`Method.score`) can be wrapped: StreamingLLM picks
positions without scores, `full` keeps everything, and a wrapper is refused as a base of the same kind.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..core.base import Method
from ..core.errors import MethodError
from ..runtime.layer_inputs import LayerInputs


class WrapperMethod(Method):
    """Base class of wrappers; subclasses are dataclasses declaring `base: str = param(...)`."""

    base: str

    def check(self) -> None:
        self.inner = self._wrap(self.base, {})

    def _wrap(self, base: str, params: dict) -> Method:
        # lazy: breaks the registry circle (KNOWN_CIRCLES in tests/test_import_graph.py)
        from ..core.registry import get_method  # the registry imports the wrappers

        if base == self.name:
            raise MethodError(f"{self.name}: base {base!r} cannot wrap itself")
        inner = get_method(base, **params)
        if not self.can_wrap(inner):
            raise MethodError(f"{self.name}: base {base!r} cannot be wrapped ({self.why_not(inner)})")
        return inner

    def can_wrap(self, inner: Method) -> bool:
        return inner.compresses and type(inner).has_layer_scores()

    def why_not(self, inner: Method) -> str:
        if not inner.compresses:
            return "it keeps everything"
        return "it selects positions without per-layer scores"

    @classmethod
    def from_params(cls, **kwargs: Any) -> Method:
        own = {f.name for f in dataclasses.fields(cls)}
        method = cls(**{k: v for k, v in kwargs.items() if k in own})
        rest = {k: v for k, v in kwargs.items() if k not in own}
        if rest:
            method.inner = method._wrap(method.base, rest)
        return method

    def params(self) -> dict:
        return {**super().params(), "base_params": self.inner.params()}

    def layer_budgets(self, budget_tokens: int, num_layers: int, prompt_len: int) -> list[int]:
        return self.inner.layer_budgets(budget_tokens, num_layers, prompt_len)

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        return self.inner.score(layer, n_keep)
