"""sdpa over a masked multi-token forward without repeating the KV heads, on CPU.

transformers' sdpa attention passes `enable_gqa` to torch only without a mask (a mask sends CUDA's GQA to the math
kernel); with a mask and more than one query it copies every KV head once per query head of its group
(`repeat_kv`). A batch's teacher-forced forward (batched_generation: every member fed the reference's output,
a mask per member) is such a forward, over a batch of whole caches: on a CPU the copy costs several times the
attention itself (SmolLM2-135M, 3 KV heads for 9 query heads, 6 KIVI members at ~1,950 tokens: 32 ms per layer
with the copies against 7 without; the outputs are bit for bit the same). torch's CPU kernels take `enable_gqa`
with a mask, so this attention function, registered with transformers' public AttentionInterface and named by
the model only inside `masked_gqa(model)`, calls sdpa so; every other call (one query, no mask, CUDA, a
position bias or softcap) goes to transformers' own sdpa attention unchanged. The model's forward is not replaced.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from .attention_hooks import attention_function
from ..adapters.transformers_compat import attention_implementation, register_attention, sdpa_attention_forward, sdpa_mask

ATTENTION_NAME = "kvbench_sdpa_masked_gqa"
_TORCH_HAS_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)  # sdpa's enable_gqa
_active: ContextVar = ContextVar("kvbench_masked_gqa", default=False)


def masked_gqa_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                         is_causal: bool | None = None, **kwargs):
    """A transformers attention function: sdpa with enable_gqa for a masked multi-token forward on CPU, else
    transformers' sdpa attention."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (attention_mask is None or query.shape[2] == 1 or groups == 1 or query.device.type != "cpu"
            or any(kwargs.get(name) is not None for name in ("position_bias", "softcap"))
            or kwargs.get("output_attentions", False)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


register_attention(ATTENTION_NAME, masked_gqa_attention, sdpa_mask)


@contextmanager
def masked_gqa(model) -> Iterator[None]:
    """While active, a model running transformers' sdpa on CPU attends with masked_gqa_attention; any other
    model is left as it is."""
    if not _TORCH_HAS_GQA or attention_implementation(model) != "sdpa" or \
            next(model.parameters()).device.type != "cpu":
        yield
        return
    with attention_function(model, ATTENTION_NAME, _active, True):
        yield
