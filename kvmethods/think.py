"""ThinK (Xu et al. 2024, "ThinK: Thinner Key Cache by Query-Driven Pruning", arXiv 2407.21018).

ThinK prunes the channel axis, not the token axis: per layer and KV head it keeps the key channels that
matter most to the recent queries and drops the rest. A channel j is scored by how much it contributes to
the observation window's attention logits, ||Q_obs[:, j] K[:, j]^T||_F = ||Q_obs[:, j]|| x ||K[:, j]||
(the window's queries of the KV head's query group, summed in squares), and the lowest `pruning_ratio` of
the channels are pruned. Defaults: pruning_ratio 0.4 (the paper's LongBench setting, λ = 0.4) and the
SnapKV observation window of 32 queries (the reference builds on SnapKV's window). Values and the keys of
tokens added after the prompt are kept whole, as in the reference.

Storage (ChannelPrunedLayer, a transformers cache layer): the prompt's kept key channels plus their
indices; on read the pruned channels come back as zeros, so q.k sums over the kept channels only, which is
exactly attention with pruned keys. Alone (`think`) it keeps every token; composed (`snapkv+think`) it
thins the keys the eviction method kept. With a quantizer it is not composed yet (one storage per cache).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from .base import Method, param, top_positions
from .compact_layer import CompactLayer
from .errors import MethodError

INDEX_BYTES = 8  # channel indices are stored as int64


class ChannelPrunedLayer(CompactLayer):
    """The prompt's keys with only `channels` kept per head; `keys` holds later tokens' full keys."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, channels: torch.Tensor):
        super().__init__()
        self.lazy_initialization(keys, values)
        self.channels = channels  # [batch, heads, kept] ascending channel indices
        self.head_dim = keys.shape[-1]
        self.pruned_keys = keys.gather(-1, channels.unsqueeze(2).expand(-1, -1, keys.shape[2], -1)).contiguous()
        self.keys = keys[..., :0, :].contiguous()
        self.values = values

    def restored_keys(self) -> torch.Tensor:
        shape = (*self.pruned_keys.shape[:3], self.head_dim)
        restored = self.pruned_keys.new_zeros(shape)
        restored.scatter_(-1, self.channels.unsqueeze(2).expand(-1, -1, shape[2], -1), self.pruned_keys)
        return torch.cat([restored, self.keys], dim=-2)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.keys = torch.cat([self.keys, key_states], dim=-2)
        self.values = torch.cat([self.values, value_states], dim=-2)
        return self.restored_keys(), self.values

    def get_seq_length(self) -> int:
        return self.values.shape[-2]

    def stored_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.pruned_keys, self.channels, self.keys, self.values))


@dataclass
class ThinK(Method):
    name = "think"
    compresses: ClassVar[bool] = False  # keeps every token
    quantizes: ClassVar[bool] = True  # changes how kept tokens are stored (storage_layer)

    pruning_ratio: float = param(0.4, "fraction of key channels pruned per KV head (paper: 0.4)")
    window: int = param(32, "observation window: the last prompt queries that score the channels", minimum=1)

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

    def storage_layer(self, keys: torch.Tensor, values: torch.Tensor, queries: torch.Tensor | None = None):
        if queries is None:
            raise MethodError("think: the observation window's queries were not captured")
        channels = top_positions(self.channel_scores(queries, keys), self.kept_channels(keys.shape[-1]))
        return ChannelPrunedLayer(keys, values, channels)

    def stored_bytes(self, tokens: int, heads: int, head_dim: int, element_size: int) -> int:
        kept = self.kept_channels(head_dim)
        return heads * (tokens * (kept + head_dim) * element_size + kept * INDEX_BYTES)
