"""Where a transformers decoder keeps its parts: its layers, each layer's softmax attention module, its rotary
embedding, and the family name it reports.

These are transformers' model conventions (`get_decoder()`, `layers`, `self_attn`, `rotary_emb`,
`config.model_type`), read by attribute and never by a family's name. They sit here, below storage and the
attention hooks, because the cache code (mixed_cache.py: which layers are linear attention) and the kvpress
adapter need them as much as the model probe (attention/model_probe.py) that describes what each layer does.
"""

from __future__ import annotations

from torch import nn

from ..core.errors import MethodError

ATTENTION_ATTR = "self_attn"


def model_family(model: nn.Module) -> str:
    return getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__


def decoder(model: nn.Module) -> nn.Module:
    return model.get_decoder() if hasattr(model, "get_decoder") else model


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    layers = getattr(decoder(model), "layers", None)
    if layers is None:
        raise MethodError(f"model family {model_family(model)!r} has no decoder `layers` list kvmethods can hook")
    return layers


def attention_modules(model: nn.Module) -> list[nn.Module | None]:
    """Each decoder layer's softmax attention module, None for a layer without one (linear attention)."""
    return [getattr(layer, ATTENTION_ATTR, None) for layer in decoder_layers(model)]


def rotary_embedding(model: nn.Module) -> nn.Module | None:
    """The decoder's shared rotary-embedding module (`rotary_emb`), used to rotate to future positions."""
    return getattr(decoder(model), "rotary_emb", None)
