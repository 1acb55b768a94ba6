"""How far an engine's answer is from a reference answer, with what an engine returns: tokens and top-n log-probs.

transformers' fidelity (engine/fidelity.py) teacher-forces a method on the reference's output and compares whole
next-token distributions. An engine decodes on its own and returns, per generated step, only its top-n log-probs,
so its figures are:

* ``token_agreement``: the share of positions where the two greedy outputs hold the same token, over the longer
  output (a missing position disagrees). Up to the first difference it equals the teacher-forced argmax
  agreement; after it the engine conditions on its own tokens, so the two may drift further apart.
* ``top_n_kl``: KL(reference || engine) on the distributions coarsened to (the reference's top-n tokens, the rest),
  over the steps up to and including the first differing token (where both condition on the same prefix, as
  decode_kl does). A token of the reference's top-n missing from the engine's top-n gets the engine's n-th
  probability, an upper bound on it. By the data-processing inequality the coarsened KL is at most the
  full-vocabulary KL; the bound on the missing tokens can move it either way, so it is an estimate, not a bound.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

_FLOOR = 1e-12


def token_agreement(reference: Sequence[int], tokens: Sequence[int]) -> float:
    length = max(len(reference), len(tokens))
    if length == 0:
        return 1.0
    return sum(1 for a, b in zip(reference, tokens) if a == b) / length


def _step_kl(reference: Mapping[int, float], engine: Mapping[int, float]) -> float:
    if not reference or not engine:
        return 0.0
    floor = min(math.exp(value) for value in engine.values())  # the engine's n-th probability
    p = {token: math.exp(value) for token, value in reference.items()}
    q = {token: math.exp(engine[token]) if token in engine else floor for token in p}
    p_rest = max(1.0 - sum(p.values()), 0.0)
    q_rest = max(1.0 - sum(q.values()), _FLOOR)
    kl = sum(pi * math.log(pi / max(q[token], _FLOOR)) for token, pi in p.items() if pi > 0)
    kl += p_rest * math.log(p_rest / q_rest) if p_rest > 0 else 0.0
    return max(kl, 0.0)


def top_n_kl(reference_tokens: Sequence[int], reference_steps: Sequence[Mapping[int, float]],
             tokens: Sequence[int], steps: Sequence[Mapping[int, float]]) -> float | None:
    """Mean coarsened KL over the steps up to and including the first differing token; None without log-probs."""
    shared = min(len(reference_steps), len(steps))
    if shared == 0:
        return None
    same = 0
    while same < min(shared, len(reference_tokens), len(tokens)) and reference_tokens[same] == tokens[same]:
        same += 1
    counted = min(same + 1, shared)
    return sum(_step_kl(reference_steps[i], steps[i]) for i in range(counted)) / counted
