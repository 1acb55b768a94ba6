"""transformers' own quantized KV caches (optimum-quanto or HQQ backends) as a method: `hf_quantized`.

transformers ships `QuantoQuantizedLayer` and `HQQQuantizedLayer` (cache_utils), the layers behind
`cache_implementation="quantized"`. Unlike KIVI they quantize keys and values along the same axis, and
they re-quantize the whole cache each time `residual` full-precision tokens have gathered. This method
stores the prompt in one of them, so the grid compares them with KIVI (kivi.py) at equal bytes. The
defaults are transformers' QuantizedCache defaults (4 bits, groups of 64, a 128-token window). The
backend package is an optional extra (`pip install "pytest-kvbench[quanto]"` or `[hqq]`); naming a backend
that is not installed is a MethodError, hence a usage error at collection. Bytes are counted from the
tensors the layer holds, whatever the backend packs them into.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from ..core.base import Method, param
from ..core.capabilities import Capability
from ..core.errors import MethodError
from .quantization import quantized_bytes
from ..adapters.transformers_compat import quantized_backend_available, quantized_layer_class

BACKENDS = {  # backend -> (pip extra, supported bits); transformers_compat knows each backend's layer class
    "quanto": ("quanto", (2, 4)),
    "hqq": ("hqq", (1, 2, 3, 4, 8)),
}


def tensor_bytes(held: Any) -> int:
    """Bytes of every plain tensor inside `held`: tensor subclasses (quanto's packed tensors) are opened
    through __tensor_flatten__, containers (HQQ's meta dicts) walked."""
    if isinstance(held, torch.Tensor):
        if hasattr(held, "__tensor_flatten__") and type(held) is not torch.Tensor:
            names, _ = held.__tensor_flatten__()
            return sum(tensor_bytes(getattr(held, name)) for name in names)
        return held.numel() * held.element_size()
    if isinstance(held, dict):
        return sum(tensor_bytes(v) for v in held.values())
    if isinstance(held, (list, tuple)):
        return sum(tensor_bytes(v) for v in held)
    return 0


class MeasuredBytes:
    """Mixed into a transformers quantized layer: the bytes and tokens generation.py reports."""

    def stored_bytes(self) -> int:
        return tensor_bytes([self._quantized_keys, self._quantized_values, self.keys, self.values])

    def tokens_per_head(self) -> list[int]:
        return [self.get_seq_length()] * self.keys_shape_heads

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a quantized cache layer cannot be cropped")

    def __deepcopy__(self, memo: dict):
        """A fork for teacher forcing (fidelity). quanto's packed tensors cannot be deep-copied; they are
        only ever replaced by update(), never written in place, so the fork shares them."""
        fork = copy.copy(self)
        fork.keys, fork.values = self.keys.clone(), self.values.clone()
        return fork


@dataclass
class HFQuantized(Method):
    name = "hf_quantized"
    paper = "transformers' QuantizedCache (quanto, HQQ)"
    capabilities = Capability.OWN_STORAGE

    backend: str = param("quanto", "transformers' quantized cache backend", choices=tuple(BACKENDS))
    bits: int = param(4, "bits per key and value (quanto: 2 or 4; hqq: 1, 2, 3, 4 or 8)")
    group_size: int = param(64, "values per quantization group", minimum=1)
    residual: int = param(128, "tokens gathered in full precision before the cache is re-quantized", minimum=1)

    environment_check = True  # the backend must be installed

    def check(self) -> None:
        extra, bits = BACKENDS[self.backend]
        if not quantized_backend_available(self.backend):
            raise MethodError(f"hf_quantized: backend {self.backend!r} is not installed: "
                              f"pip install 'pytest-kvbench[{extra}]'")
        if self.bits not in bits:
            raise MethodError(f"hf_quantized: backend {self.backend!r} supports bits {', '.join(map(str, bits))}, "
                              f"got {self.bits}")

    def storage_layer(self, keys: torch.Tensor, values: torch.Tensor, queries=None):
        base = quantized_layer_class(self.backend)
        layer = type(f"Measured{base.__name__}", (MeasuredBytes, base), {})(
            nbits=self.bits, q_group_size=self.group_size, residual_length=self.residual)
        layer.keys_shape_heads = keys.shape[1]
        layer.update(keys, values)  # the first update quantizes the whole prompt
        layer.keys, layer.values = keys[..., :0, :], values[..., :0, :]  # an empty window with the cache's shape
        return layer

    def stored_bytes(self, tokens: int, heads: int, head_dim: int, element_size: int) -> int:
        """An estimate for byte budgets: packed codes plus a scale and a zero point per group."""
        return 2 * heads * quantized_bytes(tokens * head_dim, self.bits, self.group_size, element_size)
