"""Label-free fidelity: how far a compressed cache moves the model from its full-cache self.

Task scores need references and are coarse on small samples; fidelity needs neither. For each
sample the full-cache model generates greedily once per run (the reference); every method is then
teacher-forced on that same output, and we compare next-token distributions position by position:

* ``kl``: mean over answer positions of KL(P_full || P_method), in nats;
* ``agreement``: fraction of answer positions where both distributions have the same argmax;
* ``decode_kl``: the KL of the greedy decode itself, the decode that produced the answer: the compressed
  model's own decoding distributions (through the decode loop, with its positions and any compression
  while decoding) against the full model's, over the steps where the two greedy outputs still agree, up
  to and including the first step where they differ. Up to there both condition on the same tokens, so
  this is exactly the KL along the compressed greedy tokens, without a second full-cache pass; after the
  first difference the full model's distributions along the compressed tokens are not computed.
  Teacher forcing feeds the reference in one forward, so a bug of the decoding steps alone (positions
  after eviction, say) moves ``decode_kl`` and not ``kl``.

The reference pass is shared by all methods and budgets, so it is cached. To keep the cache small
for 128k-token vocabularies we keep the top ``REFERENCE_TOP_K`` reference log-probs plus the log
of the remaining mass; KL is then computed between the two distributions coarsened onto
(top-k tokens, everything else). That is exact when the vocabulary fits in the kept set (the
embedded model) and, by the data-processing inequality, a tight lower bound otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable

import torch
from pytest_kvbench.engine.finite_logits import check_logits_finite

REFERENCE_TOP_K = 4096


@dataclass
class Reference:
    """The full-cache pass of one sample: its output and its coarsened next-token distributions."""

    result: Any  # the GenerationResult of the full-cache generation (reused by the `full` item)
    target_ids: list[int]  # tokens the methods are teacher-forced on
    top_ids: torch.Tensor | None  # [n, k] token ids kept, or None when the whole vocabulary is kept
    top_logp: torch.Tensor  # [n, k] (or [n, vocab]) reference log-probs
    rest_logp: torch.Tensor | None  # [n] log of the mass outside top_ids
    argmax: torch.Tensor  # [n] the reference's greedy token at each position


def reference_of(result: Any, what: str) -> Reference:
    """The reference made of a full-cache generation run with return_logprobs: methods are teacher-forced
    on its whole output, the stopping eos included; its per-step distributions leave the result."""
    target = list(result.tokens) + ([result.stop_token] if result.stop_token is not None else [])
    logp, result.logprobs = result.logprobs, None
    check_logits_finite(logp, what)
    return make_reference(result, target, logp)


def make_reference(result: Any, target_ids: list[int], logp: torch.Tensor, top_k: int = REFERENCE_TOP_K) -> Reference:
    logp = logp.float()
    argmax = logp.argmax(-1)
    if logp.shape[-1] <= top_k:
        return Reference(result, target_ids, None, logp.clone(), None, argmax)
    top_logp, top_ids = logp.topk(top_k, dim=-1)
    rest = torch.log1p(-top_logp.exp().sum(-1).clamp(max=1 - 1e-7))
    return Reference(result, target_ids, top_ids, top_logp, rest, argmax)


def compare(reference: Reference, logp: torch.Tensor) -> tuple[float, float]:
    """(mean KL, argmax agreement) of ``logp`` [n, vocab] against the reference."""
    n = reference.top_logp.shape[0]
    if n == 0:
        return 0.0, 1.0
    logp = logp.float()[:n]
    if reference.top_ids is None:
        ref_logp, cand_logp = reference.top_logp, logp
    else:
        cand_top = logp.gather(-1, reference.top_ids)
        cand_rest = torch.log1p(-cand_top.exp().sum(-1).clamp(max=1 - 1e-7))
        ref_logp = torch.cat([reference.top_logp, reference.rest_logp[:, None]], dim=-1)
        cand_logp = torch.cat([cand_top, cand_rest[:, None]], dim=-1)
    kl = (ref_logp.exp() * (ref_logp - cand_logp)).sum(-1).clamp(min=0.0)
    agreement = (logp.argmax(-1) == reference.argmax).float()
    return float(kl.mean()), float(agreement.mean())


def decode_divergence(reference: Reference, output_ids: list[int], logp: torch.Tensor) -> float:
    """Mean KL(P_full || P_decode) over the compressed greedy decode's steps up to and including its first
    token that differs from the reference's (``output_ids``: the decode's tokens, its stopping eos included;
    ``logp``: its per-step log-probs). Steps beyond the reference's output have no reference distribution."""
    steps = min(len(output_ids), reference.top_logp.shape[0], logp.shape[0])
    if steps == 0:
        return 0.0
    same = 0
    while same < steps and int(output_ids[same]) == int(reference.target_ids[same]):
        same += 1
    shared = min(same + 1, steps)
    head = Reference(None, reference.target_ids[:shared], None if reference.top_ids is None else reference.top_ids[:shared],
                     reference.top_logp[:shared], None if reference.rest_logp is None else reference.rest_logp[:shared],
                     reference.argmax[:shared])
    return compare(head, logp[:shared])[0]


def fidelity_of(result, reference, what: str) -> tuple[float, float, float]:
    """(kl, agreement, decode_kl) of a compressed generation run with teacher_targets and return_logprobs, against
    the reference (compare, decode_divergence); its vocabulary-sized log-probs leave the result here."""
    logprobs, result.target_logprobs = result.target_logprobs, None
    steps, result.logprobs = result.logprobs, None
    check_logits_finite(logprobs, what)
    check_logits_finite(steps, what)
    output = list(result.tokens) + ([result.stop_token] if result.stop_token is not None else [])
    return (*compare(reference, logprobs), decode_divergence(reference, output, steps))


class ReferenceCache:
    """Per-process cache of reference passes, keyed by (model, task, sample, prompt settings)."""

    def __init__(self) -> None:
        self._items: dict[Hashable, Reference] = {}
        self.computed = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def get(self, key: Hashable, compute: Callable[[], Reference]) -> Reference:
        if key not in self._items:
            self._items[key] = compute()
            self.computed += 1
        return self._items[key]
