"""Which model families the compressing methods can handle, checked before any work is done.

The hooks rely on a layout shared by the standard decoder families: `model.get_decoder().layers[i].self_attn`
with q_proj/k_proj, rotate-half RoPE passed as `position_embeddings`, and full (not sliding-window)
attention over the cache. Those are verified by tests for the families below; anything else gets a
MethodError naming the family rather than silently wrong numbers. Sliding-window attention is refused only
when the sequence is longer than the window (shorter sequences never see the window).
"""

from __future__ import annotations

from torch import nn

from .errors import MethodError
from .family_names import SUPPORTED_FAMILIES


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise MethodError(f"model family {model_family(model)!r} has no decoder `layers` list kvmethods can hook")
    return layers


def rotary_embedding(model: nn.Module) -> nn.Module | None:
    """The decoder's shared rotary-embedding module (`rotary_emb`), used to rotate to future positions."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model
    return getattr(decoder, "rotary_emb", None)


def model_family(model: nn.Module) -> str:
    return getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__


def sliding_window_in_use(config) -> int | None:
    """The sliding-window size if any layer attends through one, else None."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    if getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def check_family(model: nn.Module, method_name: str, total_tokens: int) -> None:
    """MethodError unless `method_name` can compress this model for a sequence of total_tokens."""
    family = model_family(model)
    if family not in SUPPORTED_FAMILIES:
        raise MethodError(
            f"{method_name} cannot compress model family {family!r}; supported families: {', '.join(SUPPORTED_FAMILIES)}"
        )
    window = sliding_window_in_use(model.config)
    if window is not None and total_tokens > window:
        raise MethodError(
            f"{method_name} cannot compress model family {family!r} with sliding-window attention ({window}) "
            f"over {total_tokens} tokens: compressed caches no longer map cache index to position"
        )
    for layer in decoder_layers(model):
        attention = getattr(layer, "self_attn", None)
        if attention is None or not hasattr(attention, "q_proj"):
            raise MethodError(f"{method_name} cannot compress model family {family!r}: no self_attn.q_proj in its layers")
