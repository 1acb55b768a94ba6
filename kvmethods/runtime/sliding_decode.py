"""An uncompressed cache's sliding-window layers cut to their window for decoding, as transformers' own cache holds
them.

An uncompressed prefill (the full-cache reference, or a method that keeps every token) leaves each layer of a hybrid
model (gemma2/3, gpt-oss, cohere2) holding the whole prompt. A sliding layer's mask hides all but its last `window`
tokens, yet each decoding step still read all of them: on gemma3-270m at 8k, 15 of the 18 layers attended over
8,192 keys to use 512. transformers' own cache (the one `generate` makes, DynamicCache(config=...)) holds a sliding
layer as a DynamicSlidingWindowLayer of its last `window - 1` tokens, and the model's masks read its sizes.

`windowed_for_decoding` gives a prefilled cache those layers once the prefill is measured (kv_bytes and kept tokens
are read before: the records say what the prefill held). The same keys reach every query as under the full layer's
sliding mask, so the greedy tokens are the full layers' up to float rounding, and the cache stays even (no
per-layer mask hooks). Caches holding layers of another class (compressed, windowed, quantized) stay as they are.
"""

from __future__ import annotations

from ..core.errors import MethodError
from ..attention.model_probe import sliding_windows
from ..adapters.transformers_compat import DynamicLayer, DynamicSlidingWindowLayer


def windowed_for_decoding(model, cache) -> int:
    """Turn each sliding layer of an uncompressed `cache` (every layer a plain DynamicLayer of the same length) into
    a DynamicSlidingWindowLayer holding its last `window - 1` tokens; returns how many layers changed."""
    layers = cache.layers
    if not layers or any(type(layer) is not DynamicLayer or not layer.is_initialized for layer in layers):
        return 0
    try:
        windows = sliding_windows(model)
    except MethodError:  # a family kvmethods cannot describe: no window known, the cache stays
        return 0
    length = layers[0].keys.shape[-2]
    if len(windows) != len(layers) or any(layer.keys.shape[-2] != length for layer in layers):
        return 0
    changed = 0
    for index, window in enumerate(windows):
        if window is None or length < window:
            continue
        layer = layers[index]
        sliding = DynamicSlidingWindowLayer(sliding_window=window)
        sliding.lazy_initialization(layer.keys, layer.values)
        sliding.keys = layer.keys[:, :, length - window + 1:].clone()
        sliding.values = layer.values[:, :, length - window + 1:].clone()
        sliding.cumulative_length = length
        layers[index] = sliding
        changed += 1
    return changed
