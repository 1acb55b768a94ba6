"""Methods that wrap another method's scores (adakv, criticalkv): the `base` parameter and its own parameters.

A wrapper names its base method by a string parameter (`adakv:base=snapkv`, or `base = "snapkv"` in a TOML
table), so grid files and the command line need no nested syntax. Parameters the wrapper does not declare
go to the base method (`adakv:base=snapkv:window=64`), and the record shows the base's parameters under
`base_params`. The registry builds the base (kvmethods/spec.py splits the spec) and hands it to the wrapper,
so this module needs no registry. Only methods that score positions (`Method.score`) can be wrapped:
StreamingLLM picks positions without scores, `full` keeps everything, and a wrapper is refused as a base of
the same kind.
"""

from __future__ import annotations

from typing import Any

import torch

from ..core.base import Method
from ..core.capabilities import INHERITED_FROM_BASE, Capability
from ..core.errors import MethodError
from ..core.layer_inputs import LayerInputs


class WrapperMethod(Method):
    """Base class of wrappers; subclasses are dataclasses declaring `base: str = param(...)`. The registry
    builds the base from the spec's base part (spec.py: `MethodSpec.wrapping`) and hands it to `around`,
    so a wrapper never looks a method up by name. An instance's capabilities are its class's plus what its
    base needs (`inherited`), set whenever `inner` is."""

    base: str

    @property
    def inner(self) -> Method:
        """The built base, set by `around`."""
        return self._inner

    @inner.setter
    def inner(self, method: Method) -> None:
        self._inner = method
        self.capabilities = type(self).capabilities | self.inherited(method)

    def inherited(self, inner: Method) -> Capability:
        """The capabilities the wrapper has because its base has them (whole-prompt scoring, every query)."""
        return inner.capabilities & INHERITED_FROM_BASE

    @classmethod
    def around(cls, inner: Method, **own: Any) -> Method:
        """The wrapper of `inner` (the method its `base` names) with its own parameters; MethodError when
        a parameter is unknown or the base cannot be wrapped."""
        method = cls.from_params(**own)
        method.inner = inner
        if not method.can_wrap(inner):
            raise MethodError(f"{method.name}: base {method.base!r} cannot be wrapped ({method.why_not(inner)})")
        method.check_base()
        return method

    def check_base(self) -> None:
        """Validation that needs the built base (`self.inner`); raise MethodError."""

    def can_wrap(self, inner: Method) -> bool:
        return (Capability.COMPRESSES | Capability.LAYER_SCORES) in inner.capabilities

    def why_not(self, inner: Method) -> str:
        if Capability.COMPRESSES not in inner.capabilities:
            return "it keeps everything"
        return "it selects positions without per-layer scores"

    def params(self) -> dict:
        return {**super().params(), "base_params": self.inner.params()}

    def layer_budgets(self, budget_tokens: int, num_layers: int, prompt_len: int) -> list[int]:
        return self.inner.layer_budgets(budget_tokens, num_layers, prompt_len)

    def score(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        return self.inner.score(layer, n_keep)
