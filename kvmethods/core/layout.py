"""The description of a decoder family that method code asks instead of the family's name.

A `FamilyLayout` says, per decoder layer, what kind of layer it is and how its attention reaches the cache:
- kind: "global" (softmax attention over every cached token), "sliding" (over the last `window` tokens),
  "chunked" (within fixed chunks), "linear" (linear attention / state-space: no per-token cache);
- queries: "projection" when the queries are the attention module's `q_proj` output (after a per-head
  `q_norm` if any), rotated by rotate-half RoPE unless `rope` is False: the hooks can recompute them, before
  or after RoPE; "captured" when the module computes them otherwise (a fused `qkv_proj`, a gated `q_proj`,
  a norm over the whole projection, another rotation, latent attention): the hooks take them from the
  attention call itself (attention/query_capture.py), RoPE'd, and pre-RoPE queries are not available;
- rope: whether the layer rotates its queries and keys at all (SmolLM3's no-RoPE layers, Cohere2's global ones);
- sinks: the attention module's attribute holding learned sink logits (gpt-oss), which enter the softmax;
- latent: keys and values made from a latent (DeepSeek-V3's MLA): transformers 5.24 caches the latent (one row
  per token for every head: attention/latent.py compresses it along tokens), 5.2 the keys and values
  decompressed per head.

`refusal(layout, capabilities, sliding)` is the one rule table: which kinds of layer and which query
sources a method's capabilities can work with, and the one-line reason when not. `sliding` is what a run does
with sliding-window layers (SLIDING_POLICIES): KEEP them as their window (the default) or COMPRESS them with the
method's budget too (storage/window_layer.py). It imports nothing heavy:
the startup check (pytest_kvbench/wiring/) and the docs table use it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .capabilities import Capability

GLOBAL, SLIDING, CHUNKED, LINEAR = "global", "sliding", "chunked", "linear"
PROJECTION, CAPTURED = "projection", "captured"
KEEP, COMPRESS = "keep", "compress"  # what a run does with sliding-window layers (--kvbench-sliding)
SLIDING_POLICIES = (KEEP, COMPRESS)
# What cannot compress a sliding layer within its window: a head-adaptive selection (a window holds one length per
# head), a method that runs its own prefill (kvpress' hooks), one that cuts back while decoding or after a turn (it
# would cut the global layers only, and the window grows back).
def _not_in_window(capabilities: Capability) -> str | None:
    if Capability.HEAD_ADAPTIVE in capabilities:
        return "its head-adaptive selection keeps heads uneven, and a window layer holds one length per head"
    if Capability.RUNS_PREFILL in capabilities:
        return "it compresses through its own prefill hooks, which do not see the window"
    if capabilities & (Capability.COMPRESSES_WHILE_DECODING | Capability.RECOMPRESSES_PER_TURN):
        return "it cuts the cache back while decoding or after a turn, where a window layer grows back to its window"
    if Capability.MERGES_VALUES in capabilities:
        return "it folds evicted values into the kept ones, and a window layer only selects its tokens"
    if Capability.KEEPS_LAYERS_WHOLE in capabilities:
        return "it keeps some layers whole, and a window layer compressed within its window holds the budget"
    return None


@dataclass(frozen=True)
class LayerLayout:
    kind: str = GLOBAL
    queries: str = PROJECTION  # "projection" (recomputable, pre-RoPE too) or "captured" (RoPE'd, from the call)
    rope: bool = True
    window: int | None = None  # sliding layers: the tokens a query sees (itself included)
    sinks: str | None = None  # attribute of the attention module holding learned sink logits [q_heads]
    rope_layer_type: str | None = None  # the rotary module's layer_type argument for this layer (Gemma3)
    rope_reproducible: bool = True  # the decoder's rotary module gives this layer's cos/sin (rope_at works)
    latent: bool = False  # keys and values made from a latent (MLA: no k_proj): attention/latent.py

    @property
    def has_cache(self) -> bool:
        return self.kind in (GLOBAL, SLIDING)


@dataclass(frozen=True)
class FamilyLayout:
    family: str
    attn_implementation: str
    layers: tuple[LayerLayout, ...] = field(default_factory=tuple)
    attention_attr: str = "self_attn"  # where a layer's softmax attention module is

    @property
    def needs_capture(self) -> bool:
        return any(layer.queries == CAPTURED for layer in self.layers if layer.has_cache)

    def kinds(self) -> list[str]:
        return sorted({layer.kind for layer in self.layers})

    def summary(self) -> str:
        """One line: the layer kinds and what is special (for records and docs)."""
        parts = [f"{sum(layer.kind == kind for layer in self.layers)} {kind}" for kind in self.kinds()]
        if self.needs_capture:
            parts.append("queries captured from the attention call")
        if any(not layer.rope for layer in self.layers if layer.has_cache):
            parts.append("no-RoPE layers")
        if any(layer.sinks for layer in self.layers):
            parts.append("learned sinks")
        return ", ".join(parts)


def refusal(layout: FamilyLayout, capabilities: Capability, sliding: str = KEEP) -> str | None:
    """Why a method with these capabilities cannot compress this layout (None: it can), whatever the sequence's
    length, so that the startup check (configure: no length known yet) and the runtime agree; `sliding`: what
    the run does with sliding-window layers (KEEP or COMPRESS)."""
    if Capability.COMPRESSES not in capabilities and Capability.OWN_STORAGE not in capabilities:
        return None
    cached = [layer for layer in layout.layers if layer.has_cache]
    if not cached:
        return "no layer keeps a per-token KV cache"
    if sliding == COMPRESS and Capability.COMPRESSES in capabilities and any(layer.kind == SLIDING for layer in cached):
        why = _not_in_window(capabilities)
        if why:
            return f"sliding-window layers compressed (sliding=compress): {why} (keep them: sliding=keep)"
    if any(layer.kind == CHUNKED for layer in layout.layers):
        return "chunked-attention layers: a chunk's cache is dropped at its boundary, no method's selection carries over"
    if Capability.SCORES_WHOLE_PROMPT in capabilities:
        if any(layer.kind == SLIDING for layer in cached):
            return "sliding-window layers: its repeat forwards attend over the whole context"
        if any(layer.sinks for layer in cached):
            return "learned attention sinks: its repeat-forward attention has no sink logit"
        if any(layer.latent for layer in cached):
            return "multi-head latent attention (MLA): its repeat forwards attend over the cache's rows, which " \
                   "hold the latent, not per-head keys"
        if any(layer.kind == LINEAR for layer in layout.layers):
            return "linear-attention layers: its repeat forwards would run their recurrent state on past the prompt"
    if Capability.PRE_ROPE_QUERIES in capabilities:
        if any(layer.queries != PROJECTION for layer in cached):
            return "it needs pre-RoPE queries, which this family's attention never exposes (fused or gated " \
                   "projection, a norm over the whole projection, or another rotation)"
        if any(layer.rope and not layer.rope_reproducible for layer in cached):
            return "it rotates queries to future positions, and the decoder's rotary module does not give this " \
                   "family's cos/sin"
    if Capability.PRE_ROPE_KEYS in capabilities and any(layer.queries != PROJECTION for layer in cached):
        return "it undoes RoPE on the cached keys, which this family's description does not vouch for (its " \
               "queries come from the attention call: fused or gated projection, a norm over the whole " \
               "projection, or another rotation)"
    if any(layer.latent for layer in cached):
        if Capability.HEAD_ADAPTIVE in capabilities:
            return "multi-head latent attention (MLA): head-adaptive budgets need a row per KV head, and the " \
                   "latent cache holds one row per token for every head"
        if Capability.OWN_STORAGE in capabilities:
            return "multi-head latent attention (MLA): it quantizes or prunes per-head keys and values, and the " \
                   "latent cache holds a latent and a rotary key shared by every head"
        if Capability.MERGES_VALUES in capabilities:
            return "multi-head latent attention (MLA): it folds evicted values into kept ones per KV head, and the " \
                   "latent cache holds a latent shared by every head"
    return None
