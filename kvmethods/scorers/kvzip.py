"""kvzip: keep the keys the model needs to reconstruct its own context (query-agnostic).

Kim et al. 2025, "KVzip: Query-Agnostic KV Cache Compression with Context Reconstruction"
(arXiv:2505.23416). After the prefill the model is asked to repeat the context: for each chunk of
`chunk_size` context tokens, a forward over "<repeat instruction><chat suffix><chunk>" runs on the
prefilled cache, and a key's score is the largest attention it receives from those repeat tokens (max over
the repeat queries and the query heads sharing its KV head). As in the reference, each chunk's softmax
runs over the first `n_sink` tokens, the chunk's own keys and the repeat tokens only; later chunks'
instructions end with the previous chunk's last 8 tokens, and the first n_sink tokens are always kept.
The scores come from inside the repeat forward's attention, as in the reference: `kvzip_attention.py`, an
attention function registered with transformers' AttentionInterface and named by the model only during
these forwards, computes each block of logits once for both the layer's output and the chunk's scores (the
hidden states equal sdpa's to float rounding). Each repeat forward ends at the last layer's attention, which
computes the scores only (its output, MLP and the final norm would change no score), and the repeat tokens
are then dropped from the cache, so the cache ends as it was. The extra forwards are part of the prefill time
and reported separately (`scoring_ms` in the records): at 4,096 tokens on CPU, prefill + scoring is 3.2x a
plain prefill on the tiny bench model, where attention dominates, and 2.26x on an MLP-dominated one
(docs/performance.md, lab notebook: the repeat forwards attend over 2.5x the query-key pairs of the causal
prefill by design).

Defaults chunk_size=2048 and n_sink=4 are kvpress KVzipPress's (the instruction strings too). Unlike
KVzipPress (which shares the budget over all heads and, by default, all layers), plain `kvzip` keeps the
top `budget` of each KV head; `adakv:base=kvzip:alpha=0` shares each layer's budget over its heads like
KVzipPress(layerwise=True), and `adakv:base=kvzip:alpha=0:across_layers=true` over all layers and heads like
KVzipPress(). The context is scored from its first token: KVzipPress leaves the chat
template's prefix out of the reconstruction, which kvmethods cannot see. Models without a loadable
tokenizer (the tests' random models) repeat with no instruction text.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..core.base import Method, param
from ..core.capabilities import Capability
from ..attention.families import decoder_layers
from ..attention.kvzip_attention import RepeatSpan, scoring_attention
from ..core.precision import score_dtype
from ..adapters.transformers_compat import cache_argument

FIRST_INSTRUCTION = "\n\nRepeat the previous context exactly."
LATER_INSTRUCTION = "\n\nRepeat the part of the previous context exactly, starting with"
PREVIOUS_TAIL = 8  # tokens of the previous chunk that later instructions end with


@functools.lru_cache(maxsize=8)
def _instruction_ids(source: str) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    if not source:
        return (), (), ()
    try:
        # lazy for startup time: transformers' tokenizer classes, only when KVzip builds its repeat prompt
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception:  # no tokenizer where the model came from: repeat without instruction text
        return (), (), ()
    suffix = "\n"
    if tokenizer.chat_template is not None:  # the assistant turn's opening, as KVzipPress derives it
        marker = "\n" + "#" * 13
        text = tokenizer.apply_chat_template([{"role": "user", "content": "dummy context" + marker}],
                                             add_generation_prompt=True, tokenize=False)
        suffix = text.split(marker)[-1]

    def encode(text: str) -> tuple[int, ...]:
        return tuple(tokenizer.encode(text, add_special_tokens=False))

    return encode(FIRST_INSTRUCTION), encode(LATER_INSTRUCTION), encode(suffix)


def instruction_ids(model) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(first chunk's instruction, later chunks' instruction, chat suffix) token ids for this model."""
    return _instruction_ids(str(getattr(model.config, "name_or_path", "") or ""))


def repeat_inputs(model, context: torch.Tensor, chunk_size: int) -> list[tuple[int, int, torch.Tensor]]:
    """(start, end, repeat ids [1, R]) per chunk of the context ids [1, T]."""
    first, later, suffix = (torch.tensor([ids], dtype=torch.long, device=context.device)
                            for ids in instruction_ids(model))
    out = []
    for start in range(0, context.shape[1], chunk_size):
        chunk = context[:, start:start + chunk_size]
        instruction = first if start == 0 else torch.cat([later, context[:, max(0, start - PREVIOUS_TAIL):start]], 1)
        out.append((start, start + chunk.shape[1], torch.cat([instruction, suffix, chunk], dim=1)))
    return out


# Logits per KV head computed at once by the repeat attention (kvzip_attention.py). On a CPU, 2 MiB of float32,
# the size of an L2 cache, so that one KV head's block of logits stays in cache from the matmul to the product
# with the values, while each key and value read serves as many query rows as that allows. Measured (kvzip over
# a plain prefill, 4,096 tokens): 2^18 per KV head 3.26 (bench model) / 2.28 (mlp-bound), 2^19: 3.30 / 2.22,
# 2^20: 3.35 (bench); blocks of 256 query rows (8 MB on the bench model) had made the old scoring memory-bound.
# On a GPU the block is sized by bytes over all KV heads (kernel launches, not caches, cost there).
SCRATCH_ELEMENTS = 1 << 19
GPU_SCRATCH_BYTES = 512 * 2**20
# At least this many repeat queries per block, whatever the context length: the scratch above holds a block of
# rows over every context key, so at 32k tokens it held 3 or 4 rows, and a 2,000-token chunk took ~700 blocks
# per layer (an H200 did not finish 32k in 150 s, issue 36). The block then grows with the context (linearly:
# rows x groups x columns per KV head), never with its square.
MIN_BLOCK_ROWS = 16


def block_scratch(cache, heads: int, groups: int, columns: int) -> int:
    """Logits per KV head of a block of repeat queries over `columns` keys (RepeatSpan.scratch)."""
    keys = cache.layers[0].keys
    if keys.device.type == "cuda":
        scratch = GPU_SCRATCH_BYTES // (heads * max(keys.element_size(), 4))
    else:
        scratch = SCRATCH_ELEMENTS
    return max(scratch, MIN_BLOCK_ROWS * groups * columns)


@dataclass
class KVzip(Method):
    name = "kvzip"
    paper = "Kim et al. 2025, KVzip (arXiv 2505.23416)"
    capabilities = Capability.COMPRESSES | Capability.SCORES_WHOLE_PROMPT
    kvpress_press = "KVzipPress"
    kvpress_name = "kvzip"
    chunk_size: int = param(2048, "context tokens reconstructed per repeat forward", minimum=1)
    n_sink: int = param(4, "first tokens always kept (and in every chunk's softmax)", minimum=0)

    @torch.no_grad()
    def prefill_scores(self, model, cache, input_ids: torch.Tensor) -> list[torch.Tensor]:
        layers = decoder_layers(model)
        context_len = input_ids.shape[1]
        heads = cache.layers[0].keys.shape[1]
        dtype = score_dtype(cache.layers[0].keys)
        scores = [torch.zeros(input_ids.shape[0], heads, context_len, dtype=dtype, device=input_ids.device)
                  for _ in layers]
        groups = model.config.num_attention_heads // heads
        for start, end, repeat in repeat_inputs(model, input_ids, self.chunk_size):
            positions = torch.arange(context_len, context_len + repeat.shape[1], device=repeat.device)
            scratch = block_scratch(cache, heads, groups, context_len + repeat.shape[1])
            with scoring_attention(model, RepeatSpan(context_len, start, end, min(self.n_sink, start), scratch,
                                                     scores)):
                decoder = model.get_decoder()
                decoder(input_ids=repeat, position_ids=positions.unsqueeze(0), use_cache=True,
                        **cache_argument(decoder, cache))
            for layer in cache.layers:  # drop the repeat tokens: the cache is the prefill's again
                layer.keys, layer.values = layer.keys[:, :, :context_len], layer.values[:, :, :context_len]
        for layer_scores in scores:
            layer_scores[..., : self.n_sink] = float("inf")
        return scores
