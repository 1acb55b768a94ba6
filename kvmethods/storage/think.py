"""ThinK (Xu et al. 2024, "ThinK: Thinner Key Cache by Query-Driven Pruning", arXiv 2407.21018).

ThinK prunes the channel axis, not the token axis: per layer and KV head it keeps the key channels that
matter most to the last queries of the prompt and drops the rest. Checked against the reference code,
github.com/SalesforceAIResearch/ThinK at d200577, ThinK_flash/src/kv_pruning_utils.py (`kpu` below):

- score of channel j: ||Q_obs[:, j]||^2 x ||K[:, j]||^2 over the last 32 queries and every kept key (kpu
  lines 15-17, means of squares there; the same order as our ||Q_obs[:, j] K[:, j]^T||_F, its square root);
  queries and keys after RoPE (ThinK_flash/src/llama_model.py lines 88-100);
- floor(head_dim x pruning_ratio) channels with the lowest scores are pruned (kpu lines 13 and 20);
  pruning_ratio 0.4 (run_longbench.py line 357 and scripts_longBench/eval.sh; the paper's λ = 0.4);
- the last `recent` = 32 prompt tokens keep every channel (kpu line 27; run_longbench.py line 356), as do
  the keys of tokens decoded later (src/cache_utils.py update: appended whole); values are never pruned
  (kpu lines 103 and 131 return them untouched);
- composed with eviction the keys the eviction method kept are scored and thinned (kpu line 130).
Divergences (kvmethods/README.md): the reference repeats the KV heads for every query head before pruning
(llama_model.py line 90), so each query head has its own channels and the cache holds num_heads copies; we
store the cache per KV head and score a KV head's channels with the query energy of its whole query group.

Storage (ChannelPrunedLayer, a transformers cache layer): the prompt's kept key channels plus their indices;
on read the pruned channels come back as zeros (thin_keys.py), which is exactly attention with pruned keys.
Alone (`think`) it keeps every token; composed (`snapkv+think`) it thins the keys the eviction method kept;
with KIVI (`think+kivi`, composition.py) the thin keys are quantized (kivi_layer.py).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from ..core.base import Method, param, top_positions
from ..core.capabilities import Capability
from .compact_layer import CompactLayer
from ..core.errors import MethodError
from .thin_keys import INDEX_BYTES, thinned, widened


class ChannelPrunedLayer(CompactLayer):
    """The prompt's keys but the last `recent` with only `channels` kept per head; `keys` holds the rest whole."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, channels: torch.Tensor, recent: int = 0):
        super().__init__()
        self.lazy_initialization(keys, values)
        self.channels = channels  # [batch, heads, kept] ascending channel indices
        self.head_dim = keys.shape[-1]
        pruned = max(keys.shape[2] - recent, 0)
        self.pruned_keys = thinned(keys[..., :pruned, :], channels)
        self.keys = keys[..., pruned:, :].contiguous()
        self.values = values

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        return torch.cat([widened(self.pruned_keys, self.channels, self.head_dim), self.keys], dim=-2), self.values

    def update_into(self, key_states, value_states, keys_out, values_out,
                    written: tuple[int, int] = (0, 0)) -> tuple[int, tuple[int, int]]:
        """update() into a batch's working buffers (CompactLayer.update_into): no token changes once held, so only
        what the buffers do not hold yet is written (the thin keys widened once)."""
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        n, pruned = self.values.shape[-2], self.pruned_keys.shape[-2]
        if written[0] < pruned:
            widened(self.pruned_keys[..., written[0]:, :], self.channels, self.head_dim,
                    out=keys_out[..., written[0]: pruned, :])
        start = max(written[0], pruned)
        keys_out[..., start: n, :] = self.keys[..., start - pruned:, :]
        values_out[..., written[1]: n, :] = self.values[..., written[1]:, :]
        return n, (n, n)

    def get_seq_length(self) -> int:
        return self.values.shape[-2]

    def fork(self) -> ChannelPrunedLayer:
        """A shallow copy: update() rebinds keys and values (torch.cat), never writes into a held tensor."""
        return copy.copy(self)

    def stored_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.pruned_keys, self.channels, self.keys, self.values))


@dataclass
class ThinK(Method):
    name = "think"
    paper = "Xu et al. 2024, ThinK (arXiv 2407.21018)"
    capabilities = Capability.OWN_STORAGE | Capability.READS_LAST_QUERIES | Capability.PRUNES_CHANNELS
    kvcache_factory_name = "ThinK"

    pruning_ratio: float = param(0.4, "fraction of key channels pruned per KV head (reference: 0.4)")
    window: int = param(32, "observation window: the last prompt queries that score the channels", minimum=1)
    recent: int = param(32, "last prompt tokens whose keys keep every channel (reference: 32)", minimum=0)

    @property
    def query_window(self) -> int:
        """storage_layer gets this many of the prompt's last queries (generation.prefill captures them)."""
        return self.window

    def check(self) -> None:
        if not 0.0 <= self.pruning_ratio < 1.0:
            raise MethodError(f"think: parameter 'pruning_ratio' must be in [0, 1), got {self.pruning_ratio}")

    def kept_channels(self, head_dim: int) -> int:
        return head_dim - math.floor(head_dim * self.pruning_ratio)

    def channel_scores(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """[batch, kv_heads, head_dim] ||Q_obs[:, j]|| x ||K[:, j]|| per channel j, queries [batch, q_heads, w, D]."""
        batch, kv_heads = keys.shape[:2]
        query_energy = queries.float().pow(2).sum(dim=2).view(batch, kv_heads, -1, keys.shape[-1]).sum(dim=2)
        return (query_energy * keys.float().pow(2).sum(dim=2)).sqrt()

    def kept_channel_indices(self, keys: torch.Tensor, queries: torch.Tensor | None) -> torch.Tensor:
        """[batch, kv_heads, kept] the channels each KV head keeps, ascending."""
        if queries is None:
            raise MethodError("think: the observation window's queries were not captured")
        return top_positions(self.channel_scores(queries, keys), self.kept_channels(keys.shape[-1]))

    def storage_layer(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor | None = None):
        return ChannelPrunedLayer(keys, values, self.kept_channel_indices(keys, queries), self.recent)

    def stored_bytes(self, tokens: int, heads: int, head_dim: int, element_size: int) -> int:
        kept = self.kept_channels(head_dim)
        whole = min(self.recent, tokens)
        key_values = (tokens - whole) * kept + whole * head_dim + tokens * head_dim
        return heads * (key_values * element_size + kept * INDEX_BYTES)
