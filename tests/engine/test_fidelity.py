"""Fidelity metrics: KL to the full cache and greedy agreement, and the one-prefill fast path."""

import math

import pytest
import torch

from kvmethods import Budget, get_method
from kvmethods.runtime.generation import generate, teacher_force
from kvmethods.testing import tiny_model
from pytest_kvbench.engine.fidelity import compare, decode_divergence, make_reference


def test_identical_distributions_have_zero_kl_and_full_agreement():
    logp = torch.log_softmax(torch.randn(5, 50), -1)
    ref = make_reference(None, list(range(5)), logp)
    assert compare(ref, logp.clone()) == (0.0, 1.0)


def test_kl_and_agreement_match_hand_computation():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.5, 0.25, 0.25]])
    q = torch.tensor([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]])
    ref = make_reference(None, [0, 0], p.log())
    kl, agreement = compare(ref, q.log())
    expected = (0.7 * math.log(7) + 0.1 * math.log(1 / 7)) / 2
    assert kl == pytest.approx(expected, rel=1e-5)
    assert agreement == 0.5


def test_top_k_coarsening_is_a_lower_bound_close_to_the_exact_kl():
    torch.manual_seed(0)
    p = torch.log_softmax(torch.randn(4, 1000) * 3, -1)
    q = torch.log_softmax(torch.randn(4, 1000) * 3, -1)
    exact = float((p.exp() * (p - q)).sum(-1).mean())
    coarse, _ = compare(make_reference(None, [0] * 4, p, top_k=100), q)
    assert coarse <= exact + 1e-6
    assert coarse > 0.5 * exact


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tiny_model("llama")


def test_fused_teacher_forcing_equals_a_separate_pass(model):
    ids = torch.randint(3, 100, (80,)).tolist()
    method, budget = get_method("snapkv", window=8), Budget.parse("24")
    targets = [5, 17, 42, 9]
    fused = generate(model, method, budget, ids, 70, 6, set(), "question_in_window", teacher_targets=targets)
    separate = teacher_force(model, method, budget, ids, 70, targets, "question_in_window")
    torch.testing.assert_close(fused.target_logprobs, separate)


def test_reference_logprobs_follow_the_greedy_output(model):
    ids = torch.randint(3, 100, (60,)).tolist()
    out = generate(model, get_method("full"), Budget.parse("r0"), ids, 60, 5, set(), "question_in_window",
                   return_logprobs=True)
    assert out.logprobs.shape[0] == len(out.tokens) == 5
    assert out.logprobs.argmax(-1).tolist() == out.tokens
    stop = out.tokens[2]
    stopped = generate(model, get_method("full"), Budget.parse("r0"), ids, 60, 5, {stop}, "question_in_window",
                       return_logprobs=True)
    assert stopped.stop_token == stop
    assert stopped.logprobs.argmax(-1).tolist() == out.tokens[:3]


def test_decode_kl_covers_the_steps_up_to_the_first_differing_token():
    torch.manual_seed(1)
    ref_logp = torch.log_softmax(torch.randn(6, 40), -1)
    reference = make_reference(None, ref_logp.argmax(-1).tolist(), ref_logp)
    assert decode_divergence(reference, reference.target_ids, ref_logp.clone()) == 0.0
    other = torch.log_softmax(torch.randn(6, 40), -1)
    # the decode agrees on 2 tokens, differs at step 2: steps 0..2 count, the later ones (other prefixes) do not
    output = reference.target_ids[:2] + [(reference.target_ids[2] + 1) % 40, 7, 7, 7]
    mixed = torch.cat([ref_logp[:2], other[2:]])
    expected = compare(make_reference(None, output[:3], ref_logp[:3]), mixed[:3])[0]
    assert decode_divergence(reference, output, mixed) == pytest.approx(expected) and expected > 0
    changed_later = torch.cat([mixed[:3], torch.log_softmax(torch.randn(3, 40), -1)])
    assert decode_divergence(reference, output, changed_later) == pytest.approx(expected)


def test_decode_kl_sees_a_decoding_step_bug_that_teacher_forcing_misses(model, monkeypatch):
    """Positions off after the prompt (a decode-loop bug) leave the one-forward teacher forcing alone."""
    from kvmethods.runtime import generation

    ids = torch.randint(3, 100, (60,)).tolist()
    full = generate(model, get_method("full"), Budget.parse("r0"), ids, 60, 6, set(), "question_in_window",
                    return_logprobs=True)
    reference = make_reference(full, list(full.tokens), full.logprobs)
    method, budget = get_method("snapkv", window=8), Budget.parse("24")

    def decode_kl():
        out = generate(model, method, budget, ids, 60, 6, set(), "question_in_window",
                       teacher_targets=reference.target_ids, return_logprobs=True)
        return compare(reference, out.target_logprobs)[0], decode_divergence(reference, out.tokens, out.logprobs)

    kl, good = decode_kl()
    forward = generation.forward

    def shifted(model_, cache, ids_, start, uneven, keep, **options):  # decode steps only: one token at a time
        return forward(model_, cache, ids_, start + 20 if len(ids_) == 1 else start, uneven, keep, **options)

    monkeypatch.setattr(generation, "forward", shifted)
    bad_kl, bad = decode_kl()
    assert bad_kl == pytest.approx(kl) and bad != pytest.approx(good)
