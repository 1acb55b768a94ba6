"""decoding: compress while generating, with any prefill-time scorer (`decoding:base=snapkv:interval=64`).

Reasoning models and summaries generate thousands of tokens, so a budget applied only to the prompt
stops bounding memory. kvpress' DecodingPress (NVIDIA/kvpress, kvpress/presses/generation) and R-KV
(Cai et al. 2025, arXiv 2505.24133) compress during generation: the attention inputs of the last
`interval` decoded tokens are kept, and every `interval` new tokens each layer is cut back to its budget
by the scorer, those recent tokens serving as its observation window. The prompt is compressed at
prefill by the same scorer. So the cache never holds more than its length after prefill + `interval`
tokens (budget + interval under question_in_window, where the whole prompt is compressed). Decoding keeps
the original RoPE positions. Scorers that need every prompt query (h2o) or the whole prompt (kvzip), that
keep heads uneven (adakv), run their own prefill (kvpress presses), store their own way or wrap another
cannot be used (capabilities.can_cut_back_from_recent_queries); a scorer's `window` must fit in the
interval. The default interval 128 is R-KV's buffer (its reference code, `buffer=128`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from ..attention.attention_hooks import AttentionCall, after_attention
from ..core.base import Method, param
from ..core.capabilities import Capability, SCORER, can_cut_back_from_recent_queries
from ..core.errors import MethodError
from ..attention.families import decoder_layers, rotary_embedding
from ..attention.prefill_compression import layer_selection, store_selection
from ..storage.window_layer import WindowLayer
from ..adapters.mixed_cache import token_layers
from ..core.layer_inputs import LayerInputs
from ..wrappers.score_wrapper import WrapperMethod


@contextmanager
def compressing_decode(model, state, scorer: Method, interval: int, *, cut_at_exit: bool = False) -> Iterator[list[int]]:
    """While active, each forward buffers every layer's attention inputs, and every `interval` forwards
    each layer is cut back to `state.decode_layer_budgets` by `scorer.kept_indices` over the buffered
    queries; `cut_at_exit` also cuts with what is buffered when the block ends (multi-turn re-compression
    after each turn, protocols/multi_turn.py). Yields the list of the cache length (longest layer)
    after each forward."""
    rotary = rotary_embedding(model)
    buffered: list[list[AttentionCall]] = [[] for _ in decoder_layers(model)]
    lengths: list[int] = []

    def cut_back(layer_idx: int) -> None:
        steps, buffered[layer_idx] = buffered[layer_idx], []
        layer = state.cache.layers[layer_idx]
        n_keep = state.decode_layer_budgets[layer_idx]
        if isinstance(layer, WindowLayer):  # a sliding layer keeps its window by itself
            return
        if steps and layer.keys.shape[-2] > n_keep:
            hidden, cos, sin = (torch.cat(parts, dim=1) if parts[0] is not None else None for parts in
                                zip(*((step.hidden, step.cos, step.sin) for step in steps)))
            captured = None if steps[-1].captured is None else torch.cat([step.captured for step in steps], dim=2)
            window = replace(steps[-1], hidden=hidden, cos=cos, sin=sin, captured=captured)
            store_selection(state.cache, layer_idx, scorer, layer_selection(scorer, window, layer, n_keep, None, rotary),
                            n_keep)

    def compress(call: AttentionCall) -> None:
        earlier = buffered[call.layer_idx]
        if earlier and earlier[-1].captured_keys is not None:  # MLA: only the latest call's keys are the cache's
            earlier[-1] = replace(earlier[-1], captured_keys=None, captured_values=None)
        earlier.append(call)
        if len(buffered[call.layer_idx]) >= interval:
            cut_back(call.layer_idx)
        if call.layer_idx == call.n_layers - 1:
            lengths.append(max(int(layer.keys.shape[-2]) for layer in token_layers(state.cache)))

    with after_attention(model, compress):
        yield lengths
    if cut_at_exit:
        for layer_idx in range(len(buffered)):
            cut_back(layer_idx)


def check_decoding_scorer(owner: str, scorer: Method, interval: int) -> None:
    """MethodError when `scorer` cannot cut a cache back from the last `interval` decoded tokens."""
    window = scorer.params().get("window")
    if isinstance(window, int) and window > interval:
        raise MethodError(f"{owner}: interval {interval} is shorter than the scorer's window {window}; "
                          f"use interval >= {window}")


@dataclass
class DecodingCompression(WrapperMethod):
    name = "decoding"
    paper = "kvpress DecodingPress; R-KV's buffer (Cai et al. 2025, arXiv 2505.24133)"
    capabilities = SCORER | Capability.COMPRESSES_WHILE_DECODING | Capability.WRAPS
    base: str = param("snapkv", "prefill-time scorer that also cuts the cache back while decoding")
    interval: int = param(128, "new tokens between two compressions while decoding (R-KV's buffer)", minimum=1)

    def check_base(self) -> None:
        check_decoding_scorer(self.name, self.inner, self.interval)

    def can_wrap(self, inner: Method) -> bool:
        """Any method that picks positions layer by layer (StreamingLLM included), but not one needing
        every prompt query, the whole prompt, uneven heads, its own prefill or storage, nor a wrapper."""
        return can_cut_back_from_recent_queries(inner.capabilities) and Capability.WRAPS not in inner.capabilities

    def why_not(self, inner: Method) -> str:
        if Capability.COMPRESSES not in inner.capabilities:
            return "it keeps everything"
        return ("it needs every prompt query, the whole prompt, uneven heads, its own prefill or storage, "
                "or wraps another")

    def kept_indices(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        return self.inner.kept_indices(layer, n_keep)

    def while_decoding(self, model, state):
        return compressing_decode(model, state, self.inner, self.interval)
