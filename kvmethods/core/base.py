"""The Method base class: typed, validated parameters plus the selection contract.

A method decides which prompt positions each KV head of a layer keeps. During the compressed prefill
(attention/prefill_compression.py) it is handed one layer at a time as a `LayerInputs` and answers with kept
indices; it never touches the model or the cache itself. Parameters are dataclass fields with documented
defaults; values from the CLI grid arrive as strings and are coerced by the field's annotated type, so
`window="32"` works and `window="wide"` is a MethodError naming the valid parameters.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .layer_inputs import LayerInputs
from .capabilities import Capability
from .errors import MethodError
from .layout import SLIDING_POLICIES
from .params import check_known, checked_values, declared_params, describe_params, param

# param (params.py): what every method module declares its parameters with
__all__ = ["Method", "capability_mismatch", "param", "top_positions"]


def top_positions(scores: torch.Tensor, n_keep: int) -> torch.Tensor:
    """Indices of the n_keep highest scores along the last axis, in ascending position order.
    Ties (frequent after max-pooling) go to the earlier position, on every device."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    return order[..., :n_keep].sort(dim=-1).values


@dataclass
class Method:
    """Base class of every compression method (built-in or third-party).

    Subclasses are dataclasses that set `name` and `capabilities`, declare parameters with `param(...)`, and
    implement `score` (higher = keep; the base keeps the top n per KV head) or override `kept_indices`.
    """

    name: ClassVar[str] = ""
    # What the runtime must know to run the method (capabilities.py): an evicting method by default. Every
    # method declares its own; wrappers refine it per instance.
    capabilities: ClassVar[Capability] = Capability.COMPRESSES
    # The same algorithm in other harnesses (a built-in's catalog row carries them: exports, comparisons):
    # check() reads the environment (an installed backend), not only the parameters: the catalog cannot vouch for
    # the defaults without running it (registry.describe_method)
    environment_check: ClassVar[bool] = False
    kvpress_press: ClassVar[str] = ""  # the kvpress press running it, as `kvpress:` spec tail ("SnapKVPress");
    # a wrapper's press wraps its base's press (`kvpress:AdaKVPress:press=SnapKVPress`)
    kvpress_defaults: ClassVar[str] = ""  # our parameters equal to that press's defaults ("window=64:kernel=5")
    kvpress_name: ClassVar[str] = ""  # its name in kvpress evaluation's PRESS_REGISTRY (export --format kvpress)
    kvcache_factory_name: ClassVar[str] = ""  # KVCache-Factory's --method (export --format kvcache-factory)
    paper: ClassVar[str] = ""  # where the method comes from: authors year, title (arXiv id); `kvbench methods` lists it
    query_window: ClassVar[int] = 0  # > 0: storage_layer() gets the prompt's last queries (ThinK)
    prefill_chunk: ClassVar[int] = 0  # > 0: the prompt is prefilled this many tokens at a time (chunked.py)
    # What the runtime does with a model's sliding-window layers (core/layout.SLIDING_POLICIES): "keep" them
    # as their window, or "compress" them with the method's budget too (storage/window_layer.py). A setting of
    # the run (--kvbench-sliding), not a parameter of the method: with_sliding_layers sets it per instance.
    sliding_layers: ClassVar[str] = "keep"

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

    def with_sliding_layers(self, policy: str) -> Method:
        """This method, set to keep ("keep") or compress ("compress") sliding-window layers; returns it."""
        if policy not in SLIDING_POLICIES:
            raise MethodError(f"sliding layers: {policy!r} is not one of {', '.join(SLIDING_POLICIES)}")
        self.sliding_layers = policy  # an instance attribute: not a dataclass field, so not a parameter
        return self

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
        ([batch, T]); only for methods with Capability.SCORES_WHOLE_PROMPT."""
        raise NotImplementedError(f"{type(self).__name__} declares SCORES_WHOLE_PROMPT but has no prefill_scores()")

    def prefill_context(self, model, budget_tokens: int, prompt_len: int, ratio: float | None):
        """Context manager around the prefill forward of a RUNS_PREFILL method; ratio is set for ratio budgets."""
        raise NotImplementedError(f"{type(self).__name__} declares RUNS_PREFILL but has no prefill_context()")

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
        None to keep them as they are (every method without OWN_STORAGE). `queries`: with query_window,
        the layer's last prompt queries [batch, q_heads, w, dim]."""
        return None

    def stored_bytes(self, tokens: int, heads: int, head_dim: int, element_size: int) -> int:
        """Bytes one layer stores for `tokens` kept tokens per KV head (batch 1): what byte budgets
        (memory_budget.py) trade against tokens."""
        return 2 * tokens * heads * head_dim * element_size

    def select(self, scores: torch.Tensor, n_keep: int) -> torch.Tensor:
        """What to keep given [batch, num_kv_heads, T] scores: the top n_keep of each KV head (ties go to
        the earlier position). Head-adaptive methods (adakv) instead return a bool mask [batch,
        num_kv_heads, T] keeping num_kv_heads * n_keep positions per layer, shared unevenly among heads
        (they declare HEAD_ADAPTIVE; prefill_compression.store_selection refuses such a mask from any other)."""
        return top_positions(scores, n_keep)

    def select_layers(self, scores: list[torch.Tensor], layer_budgets: list[int]) -> list[torch.Tensor]:
        """select() per layer, for methods that score the whole prompt at once (SCORES_WHOLE_PROMPT); with
        SHARES_ACROSS_LAYERS the layers' totals are free (one budget over all layers)."""
        return [self.select(layer_scores, n_keep) for layer_scores, n_keep in zip(scores, layer_budgets)]

    def kept_values(self, keys: torch.Tensor, values: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        """The values a layer stores for its kept positions `kept` [batch, kv_heads, n] out of its whole `keys` and
        `values` [batch, kv_heads, T, dim]: only for methods with Capability.MERGES_VALUES, whose kept values take
        in the evicted ones (merge); every other method stores the kept values as they are."""
        raise NotImplementedError(f"{type(self).__name__} declares MERGES_VALUES but has no kept_values()")

    def kept_indices(self, layer: LayerInputs, n_keep: int) -> torch.Tensor | None:
        """[batch, num_kv_heads, n_keep] positions to keep, ascending, distinct, all < T (or select()'s
        bool mask for head-adaptive methods, or None from a method with Capability.KEEPS_LAYERS_WHOLE: this
        layer keeps every token)."""
        return self.select(self.score(layer, n_keep), n_keep)


# The hooks through which a capability changes the runtime's path: a class that declares the capability must
# implement its hook, and a class (other than a wrapper, which forwards every hook) that implements the hook
# must declare the capability, else the runtime would silently take the plain path.
HOOKS = {Capability.LAYER_SCORES: "score", Capability.SCORES_WHOLE_PROMPT: "prefill_scores",
         Capability.RUNS_PREFILL: "prefill_context", Capability.OWN_STORAGE: "storage_layer",
         Capability.COMPRESSES_WHILE_DECODING: "while_decoding", Capability.READS_LAST_QUERIES: "query_window",
         Capability.MERGES_VALUES: "kept_values"}
SCORES_OPTIONAL = Capability.LAYER_SCORES  # a method may score positions without offering its scores to wrappers


def capability_mismatch(cls: type[Method]) -> str | None:
    """What a class's declared capabilities and its hooks disagree on (None when they agree)."""
    if not isinstance(cls.capabilities, Capability):
        return f"capabilities must be a kvmethods.Capability, got {cls.capabilities!r}"
    wraps = Capability.WRAPS in cls.capabilities
    for capability, hook in HOOKS.items():
        implemented = getattr(cls, hook) is not getattr(Method, hook)
        if capability in cls.capabilities and not implemented:
            return f"declares {capability.name} but does not implement {hook}()"
        if implemented and capability not in cls.capabilities and not wraps and capability not in SCORES_OPTIONAL:
            return f"implements {hook}() but does not declare Capability.{capability.name}"
    return None
