"""One forward of prompt or decoded tokens over a cache, and what every prefill road does around it.

The single-prompt road (generation.py), the shared prefill (shared_prefill.py), the protocols and batched
decoding all run the model the same way: explicit original RoPE positions, per-layer masks when layers hold
different lengths or are ragged, sliding-window layers over their band of keys in a multi-token forward
(attention/banded_attention.py), sdpa kept off cuDNN over a filled cache on CUDA, the request checked the same way
and a quantizer handed every kept layer. Written here once so that no road imports another's
private helpers.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from ..core.base import Method
from ..core.catalog import PROTOCOLS
from ..core.errors import MethodError
from ..attention.prefill_compression import per_layer_causal_masks
from ..storage.ragged import RaggedLayer
from ..attention.ragged_attention import ragged_attention
from ..attention.banded_attention import banded_attention
from ..storage.window_layer import WindowLayer, keep_window
from ..adapters.mixed_cache import is_state_layer, resumes_stepwise, token_layers
from ..adapters.transformers_compat import DynamicCache, DynamicLayer, cache_argument


def device_of(model) -> torch.device:
    return next(model.parameters()).device


# sdpa's kernels for a forward over a cache that already holds tokens (decoding, teacher forcing, the question
# after a compressed context), on CUDA. torch prefers cuDNN's attention on Hopper (sdp_utils.cpp,
# check_prefer_cudnn_attention, when cuDNN > 9.15), and cuDNN builds an execution graph for every new shape:
# each decoding step has a new key length, each PyramidKV layer and each padded ragged layer its own, so a
# decode built hundreds of graphs (an H200 measured PyramidKV at 0.7 tok/s at 8k and 32 tok/s at 32k with
# the same layer lengths, its graphs then built; docs/gpus.md). Flash and memory-efficient attention take any
# length without a build. The prompt's own forward (one shape per sample) keeps torch's choice.
CACHED_FORWARD_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def cached_forward_kernels(model, cached: int):
    """sdpa restricted to CACHED_FORWARD_BACKENDS for a CUDA forward after `cached` cached tokens, else nothing."""
    if cached == 0 or device_of(model).type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel(CACHED_FORWARD_BACKENDS)


@contextlib.contextmanager
def layer_masks(model, cache, uneven: bool):
    """Per-layer causal masks and ragged attention for the forwards inside (when `uneven`), opened once around
    several forwards (a decoding loop) rather than per forward: the hooks read `cache.layers` at every call."""
    if not uneven:
        yield
        return
    with per_layer_causal_masks(model, cache), ragged_attention(model, cache):
        yield


def forward(model, cache, ids: list[int], start: int, uneven: bool, logits_to_keep: int,
            masked: bool = False) -> torch.Tensor:
    """Logits [len(ids) or logits_to_keep, vocab] of one forward of `ids` at positions start.. over `cache`;
    masked: the caller holds layer_masks(model, cache, uneven) open around this forward."""
    if len(ids) > 1 and resumes_stepwise(cache):  # transformers 5.2's linear attention: one token at a time
        rows = [forward(model, cache, [token], start + i, uneven, 1, masked) for i, token in enumerate(ids)]
        return rows[-1] if logits_to_keep == 1 else torch.cat(rows)
    device = device_of(model)
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    positions = torch.arange(start, start + len(ids), device=device).unsqueeze(0)
    kwargs = dict(input_ids=input_ids, position_ids=positions, use_cache=True, logits_to_keep=logits_to_keep,
                  **cache_argument(model, cache))
    banded = banded_attention(model) if len(ids) > 1 else contextlib.nullcontext()
    with banded, cached_forward_kernels(model, start), layer_masks(model, cache, uneven and not masked):
        return model(**kwargs).logits[0]


def check_request(method: Method, input_ids: list[int], context_len: int, protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise MethodError(f"unknown protocol {protocol!r}; valid protocols: {', '.join(PROTOCOLS)}")
    if not input_ids:
        raise MethodError("input_ids is empty")
    if not 0 <= context_len <= len(input_ids):
        raise MethodError(f"context_len {context_len} outside [0, {len(input_ids)}]")
    if not isinstance(method, Method):
        raise MethodError(f"{method!r} is not a kvmethods Method")


def is_uneven(cache: DynamicCache) -> bool:
    """Layers hold different lengths or are ragged: forwards need per-layer masks (linear-attention layers hold
    no tokens and take no mask)."""
    layers = token_layers(cache)
    lengths = {layer.get_seq_length() for layer in layers}
    return len(lengths) > 1 or any(isinstance(layer, (RaggedLayer, WindowLayer)) for layer in layers)


def store_quantized(method: Method, cache: DynamicCache, queries: dict, windows: list | None = None) -> None:
    """Hand every layer's kept keys/values to the method's own storage (KIVI: quantized, window in full).
    A sliding-window layer (`windows[i]`: its window, None for global layers) is kept as its window in full
    precision, uncompressed or as the method's eviction left it (docs/models.md says why KIVI does not carry
    over to a window): its bytes count in full in kv_bytes_after and kv_bytes_window."""
    for i, layer in enumerate(cache.layers):
        window = windows[i] if windows is not None and i < len(windows) else None
        if window is not None and type(layer) is DynamicLayer:  # a whole sliding layer: its window, in full
            keep_window(cache, i, window)
            continue
        if isinstance(layer, WindowLayer) or is_state_layer(layer):  # a window, a linear layer's state: as they are
            continue
        if isinstance(layer, RaggedLayer):
            raise MethodError(f"{method.name}: a ragged (head-adaptive) cache layer cannot be quantized")
        cache.layers[i] = method.storage_layer(layer.keys, layer.values, queries.get(i))
