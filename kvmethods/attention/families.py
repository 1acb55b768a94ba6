"""Which models the compressing methods can handle, checked before any work is done.

What a model is made of is described once, as data (core/layout.py says what a layer kind means,
model_probe.py reads it off a loaded model); this module is what the runtime calls: where the layers are, and
`check_family`, which refuses with one line a method the description says cannot work on this model
(layout.refusal), instead of silently wrong numbers. It never compares a family's name.
"""

from __future__ import annotations

from torch import nn

from ..core.capabilities import SCORER
from ..core.errors import MethodError
from ..core.layout import KEEP, refusal
from ..adapters.decoder_parts import decoder_layers, model_family, rotary_embedding  # noqa: F401 (re-exported)
from .model_probe import describe, sliding_windows  # noqa: F401 (re-exported)


def check_family(model: nn.Module, method, total_tokens: int) -> None:
    """MethodError unless `method` (a Method; a name is taken as a plain scorer) can compress this model
    (total_tokens: the sequence's length, which no rule needs any more: sliding layers are kept as their window
    whatever the length)."""
    name = method if isinstance(method, str) else method.name
    capabilities = SCORER if isinstance(method, str) else method.capabilities
    try:
        layout = describe(model)
    except MethodError as exc:  # no layout the hooks know: say so for this method
        family = model_family(model)
        raise MethodError(f"{name} cannot compress model family {family!r}: "
                          f"{str(exc).replace(f'model family {family!r} ', 'it ')}") from None
    reason = refusal(layout, capabilities, getattr(method, "sliding_layers", KEEP))
    if reason is not None:
        raise MethodError(f"{name} cannot compress model family {model_family(model)!r}: {reason}")
