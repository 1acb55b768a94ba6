"""streamingllm: attention sinks plus the most recent tokens.

Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks" (arXiv:2309.17453): the first
few tokens absorb attention regardless of content, so keeping them ("sinks") next to a sliding window of
recent tokens preserves quality. Default: 4 sink tokens, the paper's choice and the StreamingLLM setting in
KVCache-Factory (window = budget - 4). The rest of the budget is the recent window.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..core.base import Method, param
from ..core.capabilities import Capability
from ..core.layer_inputs import LayerInputs


@dataclass
class StreamingLLM(Method):
    name = "streamingllm"
    paper = "Xiao et al. 2023, StreamingLLM (arXiv 2309.17453)"
    capabilities = Capability.COMPRESSES
    kvpress_press = "StreamingLLMPress"
    kvpress_name = "streaming_llm"
    kvcache_factory_name = "StreamingLLM"
    sinks: int = param(4, "initial tokens always kept (attention sinks)", minimum=0)

    def kept_indices(self, layer: LayerInputs, n_keep: int) -> torch.Tensor:
        T = layer.seq_len
        sinks = min(self.sinks, n_keep)
        positions = torch.cat(
            [torch.arange(sinks), torch.arange(T - (n_keep - sinks), T)]
        ).to(layer.keys.device)
        batch, heads = layer.keys.shape[:2]
        return positions.expand(batch, heads, n_keep)
