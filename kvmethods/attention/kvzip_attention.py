"""The attention of KVzip's repeat forwards, with the reconstruction scores taken from its own logits.

KVzip (`kvzip.py`) scores a context key by the attention it receives while the model repeats the context.
Running the model's sdpa for the hidden states and then a second query-key product for the scores paid
that attention twice per repeat forward; the reference takes the scores inside its attention kernel. This
module does the same through transformers' public `AttentionInterface` (as `ragged_attention.py` does):
while `scoring_attention()` is active the model's attention implementation is "kvbench_kvzip_repeat", whose
function receives, for each layer, the RoPE'd queries of the R repeat tokens and the keys/values after the
cache update ([T context | R repeat]). Block of query rows by block, it computes the logits once over the
columns each row may see (every context key, the repeat tokens up to itself) and from them:

- the attention output (softmax over all visible columns, times the values), what sdpa would hand o_proj;
- the chunk's scores: the softmax restricted to [first sinks | chunk | repeat up to itself], KVzip's
  definition, maxed over the block's rows and the query heads of each KV head.

Each logit is exponentiated once: the subset's against the subset's row max (which gives the restricted
softmax exactly), the other columns' against the row's overall max; the subset's part of the output is
then rescaled by one factor per row. Keys and values are laid out once per layer as
[other context | sinks | chunk | repeat], so the columns a block sees are one prefix of them (the repeat
tokens after the block's last row are never computed) and the subset is that prefix's tail.
The mask transformers builds is not needed: the layout says what each row sees (one sequence, no padding).
On an accelerator the query-key and probability-value products run in the model's dtype (tensor cores for
bf16; the reference computes its scores in the model's dtype too, snu-mllab/KVzip attention/score.py), on a
CPU in float32 (core/precision.product_dtype); the softmax, the scores and the output's sums in float32 (float64
for float64 models): float32 models compute as before.
Blocks of query rows are sized by `RepeatSpan.scratch` (kvzip.block_scratch: by the device, and at least
kvzip.MIN_BLOCK_ROWS rows, so memory grows linearly with the context and the number of blocks stays small).
The last layer computes the scores only (its subset's columns) and ends the forward there: its output, its
MLP and the final norm would change no score.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from .attention_hooks import attention_function
from ..core.errors import MethodError
from ..core.precision import product_dtype, score_dtype
from ..adapters.transformers_compat import register_attention

ATTENTION_NAME = "kvbench_kvzip_repeat"  # the name registered with transformers' AttentionInterface


@dataclass
class RepeatSpan:
    """What one repeat forward reconstructs: context tokens [start, end) of `context_len`, the first `sinks`
    tokens in every row's subset; blocks of query rows have up to `scratch` logits per KV head. Each layer's
    attention writes the chunk's columns of its `scores` [batch, kv_heads, context_len]."""

    context_len: int
    start: int
    end: int
    sinks: int
    scratch: int
    scores: list[torch.Tensor]
    scored_layers: set[int] = field(default_factory=set)


class _LastLayerScored(Exception):
    """Ends a repeat forward at the last layer's attention: nothing after it changes a score."""


_active_span: ContextVar[RepeatSpan | None] = ContextVar("kvbench_kvzip_span", default=None)


def reconstruction_layout(states: torch.Tensor, span: RepeatSpan) -> torch.Tensor:
    """Keys or values [batch, kv_heads, T + R, dim] reordered as [other context | sinks | chunk | repeat]."""
    context, sinks = span.context_len, span.sinks
    return torch.cat([states[:, :, sinks:span.start], states[:, :, span.end:context], states[:, :, :sinks],
                      states[:, :, span.start:span.end], states[:, :, context:]], dim=2)


def attend_and_score(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, span: RepeatSpan,
                     scaling: float, with_output: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(attention output [batch, R, q_heads, dim] or None without `with_output`, chunk scores [batch, kv_heads,
    end - start]) of the repeat queries [batch, q_heads, R, dim] over key/value [batch, kv_heads, T + R, dim].
    Without the output only the subset's columns are computed."""
    dtype = score_dtype(key)  # softmax, scores and output sums; the products in product_dtype(key)
    batch, q_heads, repeat, dim = query.shape
    kv_heads, context, chunk = key.shape[1], span.context_len, span.end - span.start
    groups = q_heads // kv_heads
    keys = reconstruction_layout(key, span).to(product_dtype(key))
    others = context - span.sinks - chunk  # columns outside the subset; repeat token r is column context + r
    skipped = 0 if with_output else others  # leading columns not computed
    grouped = (query.to(keys.dtype) * scaling).contiguous().view(batch, kv_heads, groups, repeat, dim)
    if with_output:
        values = reconstruction_layout(value, span).to(keys.dtype)
        out = torch.empty(batch, repeat, kv_heads, groups, dim, dtype=dtype, device=query.device)
    best = torch.zeros(batch, kv_heads, chunk, dtype=dtype, device=query.device)
    rows_per_block = max(1, span.scratch // (groups * (context + repeat - skipped)))
    for first in range(0, repeat, rows_per_block):
        last = min(repeat, first + rows_per_block)
        rows, columns = last - first, context + last
        block = grouped[:, :, :, first:last].reshape(batch, kv_heads, groups * rows, dim)
        logits = (block @ keys[:, :, skipped:columns].transpose(-1, -2)).to(dtype)  # [batch, kv_heads, G * rows, .]
        per_row = logits.view(batch, kv_heads, groups, rows, columns - skipped)
        future = torch.ones(rows, rows, dtype=torch.bool, device=query.device).triu_(1)
        per_row[..., context - skipped + first:].masked_fill_(future, float("-inf"))
        subset, rest = logits[..., others - skipped:], logits[..., :others - skipped]
        subset_max = subset.amax(-1, keepdim=True)
        subset.sub_(subset_max).exp_()
        subset_sum = subset.sum(-1, keepdim=True)
        subset.div_(subset_sum)  # KVzip's attention: the softmax restricted to [sinks | chunk | repeat]
        torch.maximum(best, per_row[..., others - skipped + span.sinks:context - skipped].amax(dim=(2, 3)), out=best)
        if not with_output:
            continue
        block_out = (subset.to(values.dtype) @ values[:, :, others:columns]).to(dtype)
        if others:
            row_max = torch.maximum(rest.amax(-1, keepdim=True), subset_max)
            rest.sub_(row_max).exp_()
            subset_weight = subset_sum * torch.exp(subset_max - row_max)  # the subset's mass against row_max
            block_out.mul_(subset_weight).add_(rest.to(values.dtype) @ values[:, :, :others])
            block_out.div_(subset_weight + rest.sum(-1, keepdim=True))
        out[:, first:last] = block_out.view(batch, kv_heads, groups, rows, dim).permute(0, 3, 1, 2, 4)
    return (out.view(batch, repeat, q_heads, dim) if with_output else None), best


def repeat_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs):
    """A transformers attention function: the repeat forward's attention, its chunk scores written for kvzip.
    The last layer's output is not computed: the forward stops there."""
    span = _active_span.get()
    last_layer = module.layer_idx == len(span.scores) - 1
    output, best = attend_and_score(query, key, value, span, query.shape[-1] ** -0.5 if scaling is None else scaling,
                                    with_output=not last_layer)
    span.scores[module.layer_idx][..., span.start:span.end] = best
    span.scored_layers.add(module.layer_idx)
    if last_layer:
        raise _LastLayerScored
    return output.to(query.dtype), None


def no_mask(*args, **kwargs) -> None:
    """The mask of this attention: none, each row's visible columns follow from the layout."""
    return None


register_attention(ATTENTION_NAME, repeat_attention, no_mask)


@contextmanager
def scoring_attention(model, span: RepeatSpan) -> Iterator[RepeatSpan]:
    """While active, the model's attention is the repeat forward's: a forward scores the chunk in every layer
    of `span.scores` and ends at the last layer's attention (the cache then still holds the repeat tokens)."""
    try:
        with attention_function(model, ATTENTION_NAME, _active_span, span):
            yield span
    except _LastLayerScored:
        pass
    unscored = sorted(set(range(len(span.scores))) - span.scored_layers)
    if unscored:
        raise MethodError(f"kvzip: the attention of layers {unscored} did not run through transformers' "
                          "AttentionInterface, so they could not be scored")
