"""The description of a loaded model (layout.FamilyLayout), read off its modules, its config and one tiny forward.

Nothing here knows a family's name. Where the layers are: the decoder's `layers`, each with a softmax
attention module `self_attn` (a layer without one, qwen3_next's linear attention, is a linear layer). What each
attention does is seen, not assumed: one forward of eight tokens runs with the query capture active
(attention/query_capture.py), and for every layer the queries its attention function received are compared
with what the hooks would recompute from `q_proj` (+ a per-head `q_norm`), with and without rotate-half RoPE:
- equal with RoPE: queries "projection", rope; equal without: "projection", no RoPE (smollm3's no-RoPE layers,
  cohere2's global layers);
- neither: "captured" (fused qkv_proj, gated q_proj, a norm over the projection, interleaved or partial
  rotation, latent attention): the hooks take the model's own queries from the call;
- a `sliding_window` keyword (or config.layer_types saying so) makes it a sliding layer with that window;
  `config.layer_types` "chunked_attention" a chunked one;
- a keyword argument that is one of the module's own parameters (gpt-oss' `s_aux=self.sinks`) names its learned
  sink logits.
Whether the decoder's rotary module gives the layer's cos/sin again (what rope_at needs) is checked the same
way. The description is made once per model object (a weak reference keeps it) and costs one tiny forward.
"""

from __future__ import annotations

import inspect
import weakref

import torch
from torch import nn

from ..core.errors import MethodError
from .query_capture import capturing_queries
from ..adapters.decoder_parts import ATTENTION_ATTR, attention_modules, model_family, rotary_embedding
from ..adapters.transformers_compat import attention_implementation
from ..core.layer_inputs import rotate_half
from ..core.layout import CAPTURED, CHUNKED, GLOBAL, LINEAR, PROJECTION, SLIDING, FamilyLayout, LayerLayout

PROBE_TOKENS = 8

_layouts: "weakref.WeakKeyDictionary[nn.Module, FamilyLayout]" = weakref.WeakKeyDictionary()


def _close(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    if a is None or a.shape != b.shape:
        return False
    tolerance = 1e-5 if b.dtype in (torch.float32, torch.float64) else 1e-2
    return float((a.float() - b.float()).abs().max()) <= tolerance * (float(b.float().abs().max()) + 1e-6)


def _projected(module: nn.Module, hidden: torch.Tensor, like: torch.Tensor) -> torch.Tensor | None:
    """What the hooks recompute: q_proj (+ per-head q_norm), [batch, heads, n, dim] before RoPE; None if the
    module has no q_proj of the queries' size."""
    q_proj = getattr(module, "q_proj", None)
    if not isinstance(q_proj, nn.Module):
        return None
    batch, heads, n, dim = like.shape
    try:
        q = q_proj(hidden).view(batch, n, -1, dim)
        if q.shape[2] != heads:
            return None
        q_norm = getattr(module, "q_norm", None)
        if q_norm is not None:
            q = q_norm(q)
        return q.transpose(1, 2)
    except (RuntimeError, ValueError):  # another layout: shapes do not fit
        return None


def _rotated(q: torch.Tensor | None, cos, sin) -> torch.Tensor | None:
    if q is None or cos is None or cos.shape[-1] != q.shape[-1]:
        return None
    return q * cos.unsqueeze(1) + rotate_half(q) * sin.unsqueeze(1)


def _rope_reproducible(rotary, layer_type: str | None, hidden, cos, sin) -> bool:
    if rotary is None or cos is None:
        return False
    positions = torch.arange(cos.shape[1], device=hidden.device).unsqueeze(0)
    try:
        again = rotary(hidden, positions, *([layer_type] if layer_type else []))
    except (TypeError, RuntimeError, KeyError):
        return False
    return _close(again[0], cos) and _close(again[1], sin)


def _sinks(module: nn.Module, kwargs: dict) -> str | None:
    for name, parameter in module.named_parameters(recurse=False):
        if any(value is parameter for value in kwargs.values()):
            return name
    return None


def _layer_type_argument(rotary) -> bool:
    return rotary is not None and "layer_type" in inspect.signature(rotary.forward).parameters


def sliding_windows(model: nn.Module) -> list[int | None]:
    """Each decoder layer's sliding window (None: not a sliding layer), from the model's description."""
    return [layer.window for layer in describe(model).layers]


def describe(model: nn.Module) -> FamilyLayout:
    """The model's FamilyLayout (made once per model object)."""
    known = _layouts.get(model)
    if known is None:
        known = _layouts[model] = _probe(model)
    return known


@torch.no_grad()
def _probe(model: nn.Module) -> FamilyLayout:
    config = model.config
    modules = attention_modules(model)
    layer_types = getattr(config, "layer_types", None) or [None] * len(modules)
    rotary = rotary_embedding(model)
    typed_rope = _layer_type_argument(rotary)
    inputs: dict[int, tuple] = {}

    def keep(layer_idx):
        def pre_hook(module, args, kwargs):
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            cos, sin = kwargs.get("position_embeddings") or (None, None)
            inputs[layer_idx] = (hidden, cos, sin)
        return pre_hook

    handles = [module.register_forward_pre_hook(keep(i), with_kwargs=True)
               for i, module in enumerate(modules) if module is not None]
    device = next(model.parameters()).device
    vocab = int(getattr(config, "vocab_size", 0) or 0) or PROBE_TOKENS + 3
    ids = (torch.arange(PROBE_TOKENS, device=device) * 7 + 3) % vocab
    try:
        with capturing_queries(model, keep_kwargs=True) as calls:
            model(input_ids=ids.unsqueeze(0), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    layers = []
    for i, module in enumerate(modules):
        layer_type = layer_types[i] if i < len(layer_types) else None
        if module is None:
            layers.append(LayerLayout(kind=LINEAR, rope=False))
            continue
        query, kwargs = calls.queries.get(i), calls.kwargs.get(i, {})
        if query is None or i not in inputs:
            raise MethodError(f"model family {model_family(model)!r} has a layer ({i}) whose attention does not go "
                              f"through transformers' attention interface, so kvmethods cannot see its queries")
        hidden, cos, sin = inputs[i]
        plain = _projected(module, hidden, query)
        if _close(_rotated(plain, cos, sin), query):
            source, rope = PROJECTION, True
        elif _close(plain, query):
            source, rope = PROJECTION, False
        else:
            source, rope = CAPTURED, cos is not None
        window = kwargs.get("sliding_window")
        if not isinstance(window, int) and layer_type == "sliding_attention":
            window = getattr(config, "sliding_window", None)
        kind = SLIDING if isinstance(window, int) and window > 0 else GLOBAL
        if layer_type == "chunked_attention" or kwargs.get("attention_chunk_size"):
            kind = CHUNKED
        rope_type = layer_type if typed_rope else None
        layers.append(LayerLayout(kind=kind, queries=source, rope=rope, window=window if kind == SLIDING else None,
                                  sinks=_sinks(module, kwargs), rope_layer_type=rope_type,
                                  rope_reproducible=rope and _rope_reproducible(rotary, rope_type, hidden, cos, sin),
                                  latent=not any(isinstance(getattr(module, name, None), nn.Module)
                                                 for name in ("k_proj", "qkv_proj"))))
    return FamilyLayout(model_family(model), attention_implementation(model), tuple(layers), ATTENTION_ATTR)
