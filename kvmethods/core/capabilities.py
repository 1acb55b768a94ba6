"""What the runtime must know about a method, as one declared value: `Method.capabilities`.

The runtime takes a different path for a method that scores the whole prompt after a plain prefill
(kvzip), runs its own prefill (kvpress presses), stores its kept tokens its own way (quantizers, ThinK),
keeps uneven heads (adakv), compresses while decoding (rkv), ... It asks the method's capabilities, never
its name, so a new method that declares what it does takes the right path (and one that declares a hook
it does not implement is refused when it is registered: base.capability_mismatch).

Every method declares `capabilities = Capability.X | Capability.Y` on its class (kvmethods/README.md, "Adding
your own method"); a built-in's catalog row (catalog_rows.py, generated from the class, read without torch)
carries a copy for validation without imports. Wrappers and compositions refine them per instance
from the methods they wrap (score_wrapper.py, delegating_wrapper.py). This module imports nothing (the plugin reads it
at configure time).
"""

from __future__ import annotations

from enum import Flag, auto


class Capability(Flag):
    """One bit per thing a method does that changes how the runtime runs it."""

    COMPRESSES = auto()  # evicts prompt tokens (not: the full cache, a quantizer or ThinK alone)
    LAYER_SCORES = auto()  # score(): per-layer scores a wrapper can reuse (adakv, criticalkv, decoding)
    SCORES_WHOLE_PROMPT = auto()  # prefill_scores(): scores the prompt after a plain prefill (kvzip)
    NEEDS_ALL_QUERIES = auto()  # its scores need every prompt query (h2o), not just the recent ones
    HEAD_ADAPTIVE = auto()  # select() shares a layer's budget unevenly among heads: a ragged cache (adakv)
    SHARES_ACROSS_LAYERS = auto()  # select_layers() shares the budget over all layers (adakv:across_layers)
    RUNS_PREFILL = auto()  # prefill_context(): compresses inside its own prefill forward (kvpress presses)
    CHANGES_PREFILL = auto()  # its selection needs a prefill forward of its own (chunked prefill)
    OWN_STORAGE = auto()  # storage_layer(): stores the kept tokens its own way (quantizers, ThinK)
    READS_LAST_QUERIES = auto()  # query_window: its storage_layer() needs the prompt's last queries (ThinK)
    PRUNES_CHANNELS = auto()  # a storage that thins keys, composable before a quantizer (ThinK)
    TAKES_CHANNELS = auto()  # a quantizer whose storage_layer() takes thin keys (KIVI)
    COMPRESSES_WHILE_DECODING = auto()  # while_decoding(): cuts the cache back while generating (decoding, rkv)
    RECOMPRESSES_PER_TURN = auto()  # cut back to its budget after each multi-turn turn (per_turn=true)
    WRAPS = auto()  # builds on a base method named by its `base` parameter (score_wrapper.py)
    PRE_ROPE_QUERIES = auto()  # its scores need pre-RoPE queries and RoPE at future positions (expected_attention)
    DECODES_ALONE = auto()  # its decoding cannot join a batch of other members' caches (a third party's own cache)
    PRE_ROPE_KEYS = auto()  # its scores need every scored key before RoPE, at the forward's positions (leverage)
    MERGES_VALUES = auto()  # kept_values(): the kept tokens' values take in the evicted ones' (merge)
    KEEPS_LAYERS_WHOLE = auto()  # kept_indices() may answer None: that layer keeps every token (simlayerkv)


SCORER = Capability.COMPRESSES | Capability.LAYER_SCORES  # the common case: evicts by per-layer scores

# Any of these: the method cannot take its selection from a prefill forward shared with other methods
# (shared_prefill.py) and prefills alone. A per-turn method rewrites the cache between turns, so its
# prefill is its own too. Whole-prompt scorers (kvzip) score the shared full cache and quantizers store
# their selection after the shared forward: they share it.
PREFILLS_ALONE = (Capability.RUNS_PREFILL | Capability.CHANGES_PREFILL | Capability.READS_LAST_QUERIES
                  | Capability.COMPRESSES_WHILE_DECODING | Capability.RECOMPRESSES_PER_TURN)
# Any of these: the method cannot cut a grown cache back layer by layer from the most recent queries
# (decoding's bases, per_turn): it needs more than those queries, keeps uneven heads or stores its own way.
# Pre-RoPE keys are undone from the forward's own rotation, which a grown cache's older keys did not get there.
NOT_FROM_RECENT_QUERIES = (Capability.SCORES_WHOLE_PROMPT | Capability.RUNS_PREFILL | Capability.HEAD_ADAPTIVE
                           | Capability.NEEDS_ALL_QUERIES | Capability.OWN_STORAGE | Capability.PRE_ROPE_KEYS)
# Any of these: the method cannot evict chunk by chunk during the prefill (chunked.py): a later chunk's forward
# has not the earlier chunks' positions to undo their keys' RoPE (PRE_ROPE_KEYS).
NOT_CHUNK_BY_CHUNK = (Capability.SCORES_WHOLE_PROMPT | Capability.RUNS_PREFILL | Capability.HEAD_ADAPTIVE
                      | Capability.PRE_ROPE_KEYS)
# What a wrapper needs because its base needs it (adakv over kvzip scores the whole prompt, like kvzip).
INHERITED_FROM_BASE = (Capability.SCORES_WHOLE_PROMPT | Capability.NEEDS_ALL_QUERIES | Capability.PRE_ROPE_QUERIES
                       | Capability.PRE_ROPE_KEYS)
# The rewrites of the cache while or after decoding: an answer that must leave the cache is decoded on a copy.
REWRITES_WHILE_DECODING = Capability.COMPRESSES_WHILE_DECODING | Capability.RECOMPRESSES_PER_TURN


# Any of these: the method decodes alone, not in a batch with the other members of its sample
# (runtime/batched_generation.py): it changes its cache while decoding (a batch's caches change only by the
# tokens appended), runs its own prefill (kvpress presses mask through their own hooks) or says so.
# Storages of their own (OWN_STORAGE: quantizers, ThinK) batch with each other (storage/batched.MemberLayers).
DECODES_ALONE = (Capability.COMPRESSES_WHILE_DECODING | Capability.RECOMPRESSES_PER_TURN | Capability.RUNS_PREFILL
                 | Capability.DECODES_ALONE)


def decodes_alone(capabilities: Capability) -> bool:
    """Whether a method with these capabilities decodes alone instead of in its sample's batch."""
    return bool(capabilities & DECODES_ALONE)


def prefills_alone(capabilities: Capability) -> bool:
    """Whether a method with these capabilities runs its own prefill instead of sharing one."""
    return bool(capabilities & PREFILLS_ALONE)


def can_cut_back_from_recent_queries(capabilities: Capability) -> bool:
    """Whether a method with these capabilities can cut a grown cache back to its budget layer by layer,
    scoring with the most recent queries (compression while decoding, per_turn)."""
    return Capability.COMPRESSES in capabilities and not capabilities & NOT_FROM_RECENT_QUERIES


def can_prefill_in_chunks(capabilities: Capability) -> bool:
    """Whether a method with these capabilities can evict after each chunk of a chunked prefill."""
    return Capability.COMPRESSES in capabilities and not capabilities & NOT_CHUNK_BY_CHUNK
