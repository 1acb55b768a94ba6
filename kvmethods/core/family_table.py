"""The families the project tests, each described once, next to the others: what the startup check and
docs/models.md know of a model before it loads.

A loaded model is described by probing it (attention/model_probe.py); before any weights load, only its config.json is at hand.
Each row here holds what a config does not say: where the softmax layers' queries come from (PROJECTION: the
hooks recompute them from `q_proj`; CAPTURED: from the attention call), which layers rotate by RoPE, learned
sinks, latent attention. The layer kinds come from the config itself (`layer_types`, `sliding_window`). So
`layout_of(config)` is the FamilyLayout the probe would find, and tests/kvmethods/test_families.py checks that it
is, for a tiny model of every row. A family not listed is described by the probe once loaded: one whose layout
the hooks know compresses without a row here.
"""

from __future__ import annotations

from dataclasses import dataclass

from .layout import CAPTURED, CHUNKED, GLOBAL, LINEAR, PROJECTION, SLIDING, FamilyLayout, LayerLayout

ALL, ON_SLIDING, BY_CONFIG = "all", "sliding", "no_rope_layers"  # which layers rotate by RoPE


@dataclass(frozen=True)
class FamilyFacts:
    queries: str = PROJECTION  # CAPTURED: some softmax layer's queries only the attention call has
    rope_on: str = ALL  # ON_SLIDING: cohere2's global layers have none; BY_CONFIG: smollm3's no_rope_layers
    sinks: bool = False  # learned sink logits in every softmax (gpt-oss)
    latent: bool = False  # multi-head latent attention (DeepSeek-V3)
    note: str = ""  # what is special, for docs/models.md
    kinds: tuple[str, ...] = (GLOBAL,)  # the layer kinds of its tested model (testing.family_config; a test checks)


FAMILIES: dict[str, FamilyFacts] = {
    "llama": FamilyFacts(),
    "mistral": FamilyFacts(note="every layer slides when `sliding_window` is set"),
    "qwen2": FamilyFacts(),
    "qwen3": FamilyFacts(note="per-head q/k norms"),
    "qwen3_moe": FamilyFacts(note="per-head q/k norms; MoE feed-forward"),
    "granite": FamilyFacts(note="attention multiplier as the softmax scale"),
    "gemma2": FamilyFacts(note="sliding and global layers; eager attention (no sdpa in its class)",
                          kinds=(SLIDING, GLOBAL)),
    "gemma3_text": FamilyFacts(note="sliding and global layers with their own RoPE; per-head q/k norms",
                               kinds=(SLIDING, GLOBAL)),
    "smollm3": FamilyFacts(rope_on=BY_CONFIG, note="layers without RoPE (`no_rope_layers`)"),
    "phi3": FamilyFacts(CAPTURED, note="fused `qkv_proj`"),
    "olmo2": FamilyFacts(CAPTURED, note="q/k norms over the whole projection"),
    "glm4": FamilyFacts(CAPTURED, note="partial, interleaved RoPE"),
    "cohere2": FamilyFacts(CAPTURED, rope_on=ON_SLIDING, note="interleaved RoPE on sliding layers, none on global ones",
                           kinds=(SLIDING, GLOBAL)),
    "gpt_oss": FamilyFacts(CAPTURED, sinks=True, note="learned sinks; sliding and global layers; MoE; eager attention",
                           kinds=(SLIDING, GLOBAL)),
    "deepseek_v3": FamilyFacts(CAPTURED, latent=True, note="multi-head latent attention (MLA): the latent cache "
                               "compressed along tokens, scored from the decompressed keys; MoE"),
    "qwen3_next": FamilyFacts(CAPTURED, note="linear-attention layers between softmax ones (gated queries): their "
                              "state kept in full, counted in the memory figures; MoE", kinds=(LINEAR, GLOBAL)),
}

_KINDS = {"sliding_attention": SLIDING, "chunked_attention": CHUNKED, "linear_attention": LINEAR,
          "full_attention": GLOBAL}


def layer_kinds(config) -> list[tuple[str, int | None]]:
    """(kind, window) of each layer, from the config alone."""
    n_layers = int(getattr(config, "num_hidden_layers", 0) or 0)
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not types:
        slides = bool(window) and getattr(config, "use_sliding_window", True) is not False
        types = ["sliding_attention" if slides else "full_attention"] * n_layers
    kinds = [_KINDS.get(kind, GLOBAL) for kind in types]
    return [(kind, int(window) if kind == SLIDING and window else None) for kind in kinds]


def layout_of(config) -> FamilyLayout | None:
    """The FamilyLayout of a model of this config (None: the family has no row; the probe describes it once
    loaded)."""
    family = getattr(config, "model_type", None)
    facts = FAMILIES.get(family)
    if facts is None:
        return None
    no_rope = getattr(config, "no_rope_layers", None) or []
    layers = []
    for i, (kind, window) in enumerate(layer_kinds(config)):
        if kind == LINEAR:
            layers.append(LayerLayout(kind=LINEAR, rope=False))
            continue
        rope = {ALL: True, ON_SLIDING: kind == SLIDING, BY_CONFIG: bool(no_rope[i]) if i < len(no_rope) else True}
        layers.append(LayerLayout(kind=kind, queries=facts.queries, rope=rope[facts.rope_on], window=window,
                                  sinks="sinks" if facts.sinks else None, latent=facts.latent))
    return FamilyLayout(family, "", tuple(layers))


def tested_layout(family: str) -> FamilyLayout:
    """The family's layout from its facts alone, one layer per kind of its tested model: what `refusal` needs to
    name the methods a family refuses without a config or torch (`kvbench methods`); the same refusals as the
    layout of its tiny model's config (tests/kvmethods/test_families.py)."""
    facts = FAMILIES[family]
    layers = []
    for kind in facts.kinds:
        if kind == LINEAR:
            layers.append(LayerLayout(kind=LINEAR, rope=False))
            continue
        rope = facts.rope_on != ON_SLIDING or kind == SLIDING
        layers.append(LayerLayout(kind=kind, queries=facts.queries, rope=rope, window=1 if kind == SLIDING else None,
                                  sinks="sinks" if facts.sinks else None, latent=facts.latent))
    return FamilyLayout(family, "", tuple(layers))
