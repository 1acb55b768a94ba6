"""Byte budgets ("m0.25"): the operating point each method runs at to store a fraction of the full cache.

The full cache of a T-token prompt stores 2 x T x heads x head_dim values per layer in the model's dtype.
A byte budget allows `fraction` of that per layer; each method's `stored_bytes(tokens, ...)` says what
it stores for a number of kept tokens, and the operating point is the most tokens that fit:

- eviction (snapkv, h2o, ...): fraction x T tokens (stored_bytes is linear in tokens);
- a quantizer alone (kivi): every token; its bytes are fixed by bits, group size and window, and the record
  says how far they are from the budget (a 2-bit KIVI needs a prompt several windows long to fit m0.25);
- eviction composed with a quantizer (snapkv+kivi): the most tokens whose quantized storage (codes, scales,
  zero points, full-precision window) fits, i.e. fewer tokens at fewer bits.
The budget is a fraction of the whole prompt's full cache; under the query_agnostic protocol the question,
appended uncompressed, counts against it at full precision, so the context keeps fewer tokens.
Records hold the bytes really stored and their distance to the budget (generation.record_fields).
Sliding-window layers (`windows`) store what they really hold, not the method's tokens: kept as their window
(sliding "keep"), at most `window - 1` tokens whatever the budget, compressed ("compress") at most the method's
tokens (+ the question) and the window. The allowance is the model's (fraction x every layer's full cache), and the
global layers' tokens are the most for which global + window layers fit it: a window smaller than its share leaves
the rest to the global layers, a window larger than it (a short prompt, a large window) takes it from them; where
the windows alone exceed it, the global layers keep 1 token and the record says by how much the bytes are over.
(A budget that compresses nothing leaves every layer whole, the windows too: the model's own uncompressed cache.)
The geometry comes from the config: for eviction the operating point does not depend on it (stored_bytes is
linear in tokens), so MLA's latent cache (its real bytes are what the records measure) and qwen3_next's softmax
layers get their fraction of what they store; the linear layers' fixed state is outside the allowance and added
to it in full (generation.byte_allowance). Methods whose bytes do depend on the geometry (quantizers) are refused
on the latent cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from .base import Method
from .budget import Budget
from .capabilities import Capability


@dataclass(frozen=True)
class CacheGeometry:
    """What one token costs in one layer of a model's full cache."""

    heads: int  # KV heads
    head_dim: int
    element_size: int  # bytes per value in the model's dtype

    @classmethod
    def of(cls, model) -> CacheGeometry:
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(heads, head_dim, next(model.parameters()).element_size())

    def full_bytes(self, tokens: int) -> int:
        return 2 * tokens * self.heads * self.head_dim * self.element_size


def allowed_bytes(budget: Budget, prompt_len: int, geometry: CacheGeometry) -> int:
    """Bytes per layer a byte budget allows for a prompt of this length."""
    return int(budget.value * geometry.full_bytes(prompt_len))


def operating_point(method: Method, budget: Budget, prompt_len: int, geometry: CacheGeometry,
                    uncompressed: int = 0, windows: list[int | None] | None = None) -> int:
    """Tokens per layer the method keeps of the compressed part of a prompt under a byte budget (at least 1):
    the last `uncompressed` tokens (query_agnostic's question) are stored in full and count against it.
    `windows`: per layer holding a per-token cache, its sliding window (None: global); the sliding layers count
    what they hold (the module's docstring), as `method.sliding_layers` keeps or compresses them."""
    compressed = prompt_len - uncompressed
    if Capability.COMPRESSES not in method.capabilities:
        return compressed
    stored = lambda n: method.stored_bytes(n, geometry.heads, geometry.head_dim, geometry.element_size)  # noqa: E731
    sliding = [window for window in windows or [] if window is not None]
    if not sliding:  # every layer alike: the per-layer allowance (as the totals over layers, exactly)
        allowed = allowed_bytes(budget, prompt_len, geometry) - geometry.full_bytes(uncompressed)
        # stored() is not monotone under KIVI (it dips when a window of keys gets quantized): scan down
        return next((n for n in range(compressed, 0, -1) if stored(n) <= allowed), 1)
    global_layers = len(windows) - len(sliding)
    allowed = len(windows) * allowed_bytes(budget, prompt_len, geometry)
    compress = method.sliding_layers == "compress"

    def held(n: int) -> int:  # global + window layers at n tokens per layer, in full precision for the windows
        if n >= compressed:  # nothing is compressed: every layer holds the whole prompt, the windows too
            return global_layers * (stored(n) + geometry.full_bytes(uncompressed)) + \
                len(sliding) * geometry.full_bytes(prompt_len)
        windows_held = sum(geometry.full_bytes(min(window - 1, n + uncompressed if compress else prompt_len))
                           for window in sliding)
        return global_layers * (stored(n) + geometry.full_bytes(uncompressed)) + windows_held

    return next((n for n in range(compressed, 0, -1) if held(n) <= allowed), 1)
