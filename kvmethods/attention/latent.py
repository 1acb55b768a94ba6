"""Multi-head latent attention (MLA, DeepSeek-V3): compressing a cache of latents along tokens.

transformers 5.24 caches an MLA layer compressed: per token, the normalised latent ([batch, 1, T, kv_lora_rank],
the cache layer's `keys`) and the rotary key shared by every head ([batch, 1, T, rope_dim], its `values`); the
attention module decompresses them (kv_b_proj) into per-head keys and values at every forward. (5.2 caches the
decompressed per-head keys and values: that cache is compressed per head like any other, nothing here applies.)

A latent row serves every head, so a layer keeps one set of positions for all heads. The method scores with what
attention really uses: the per-head keys and values the attention call received (query_capture keeps them with
the queries), the method's per-head scores are averaged over the heads, as a GQA group's query heads are averaged
for the KV head they share (here every query head shares the latent), and the method's own select() keeps the
top positions, gathered from the latent and the rotary key alike (prefill_compression.store_selection). A method
that picks positions without scores (StreamingLLM) must pick the same ones for every head. Head-adaptive budgets and
storages of their own (quantizers, channel pruning) have no per-head rows to work on: core/layout.refusal
refuses them in one line.
"""

from __future__ import annotations

import torch

from ..core.base import Method
from ..core.capabilities import Capability
from ..core.errors import MethodError
from ..core.layer_inputs import LayerInputs


def holds_latent(layer, keys: torch.Tensor | None) -> bool:
    """Whether a cache layer holds something else than the keys its attention used (`keys`, captured from the
    call): MLA's latent cache (transformers 5.24)."""
    return keys is not None and tuple(layer.keys.shape[1:2]) + tuple(layer.keys.shape[3:]) != \
        tuple(keys.shape[1:2]) + tuple(keys.shape[3:])


def latent_kept_indices(method: Method, inputs: LayerInputs, n_keep: int) -> torch.Tensor:
    """[batch, 1, n_keep] positions of the latent cache to keep: `method` scores with `inputs` (the per-head
    decompressed keys and values), its scores averaged over the heads, its select() picks."""
    if Capability.LAYER_SCORES in method.capabilities:
        try:
            scores = method.score(inputs, n_keep)
        except NotImplementedError:  # a wrapper over a method that picks positions without scores
            scores = None
        if scores is not None:
            return method.select(scores.mean(dim=1, keepdim=True), n_keep)
    kept = method.kept_indices(inputs, n_keep)
    if kept is None:  # the method keeps this layer whole (Capability.KEEPS_LAYERS_WHOLE)
        return None
    if kept.dtype == torch.bool or not bool((kept == kept[:, :1]).all()):
        raise MethodError(f"{method.name}: picks different positions per head without scores, and a multi-head "
                          f"latent attention cache keeps one set of positions for every head")
    return kept[:, :1]
