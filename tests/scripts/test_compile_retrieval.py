"""The pieces scripts/default_model/compile_retrieval.py designs for the default model's key-matching circuit.

RoPE kernels: the bag head needs a flat window (every key token of a needle weighs the same, so the
question's bag equals the needle's), the carry head a kernel that always prefers the latest anchor,
and the previous-token heads a sharp peak; all must hold out to 8,192 tokens, where RoPE's periodic
terms could bring a far position back. The copy alphabet must hold every token an answer can need,
and the match codes must keep a mismatch from scoring as a match."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "default_model"))
import compile_retrieval as CR  # noqa: E402
import rope_kernels as RK  # noqa: E402


def kernel(pairs, a, b, d):
    w = RK._freqs(pairs)
    return np.cos(np.outer(d, w)) @ a + np.sin(np.outer(d, w)) @ b


def test_window_kernel_is_flat_inside_and_far_below_outside():
    width = int(CR.DEFAULTS["window"])
    a, b, t = RK.window_kernel(CR.ODD, width=width)
    inside = kernel(CR.ODD, a, b, np.arange(1, width + 1))
    outside = kernel(CR.ODD, a, b, np.arange(width + 4, 8193))
    assert t > 8
    assert np.ptp(inside) <= 1.0 + 1e-6
    assert outside.max() <= inside.min() - 8


def test_recency_kernel_prefers_the_latest_anchor_at_any_distance():
    a, b, t = RK.recency_kernel(CR.FAST, span=64, gap=3)
    f = kernel(CR.FAST, a, b, np.arange(0, 8193))
    assert t > 5
    near = f[:65]
    assert np.all(near[:-3] - near[3:] >= t - 1e-6)  # 3 tokens nearer always wins by t
    assert f[68:].max() <= near[-1] - t + 1e-6  # nothing beyond the span outscores its end


def test_old_heads_keep_their_rope_frequencies():
    """Trained pair j (head_dim 32, theta 1e10) lands on pair 2j (head_dim 128, theta 1e20): same frequency."""
    old = 1e10 ** (-np.arange(16) * 2 / 32)
    rows = CR._old_rows(0)[:16]
    assert np.allclose(RK._freqs(rows), old)


@pytest.mark.parametrize("at", [1, 2, 3])
def test_previous_token_kernels_peak_where_they_should(at):
    """Layer 0 reads t-1, t-2, t-3 by position alone: the peak must beat every other offset by a wide margin."""
    a, b, t = RK.peak_kernel(CR.LOW, at)
    f = kernel(CR.LOW, a, b, np.arange(0, 8193))
    assert t > 100
    assert int(np.argmax(f)) == at
    assert np.sort(f)[-2] <= f[at] - t + 1e-6


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    import pytest_kvbench

    return AutoTokenizer.from_pretrained(str(Path(pytest_kvbench.__file__).resolve().parent / "default_model"))


def test_alphabet_holds_every_token_of_a_uuid_or_number_answer(tokenizer):
    """A value token outside the copy alphabet could never be output: the answer would be wrong for sure."""
    import random
    import uuid

    alphabet = set(CR.alphabet(tokenizer))
    rng = random.Random(0)
    for _ in range(500):
        value = str(uuid.UUID(int=rng.getrandbits(128), version=4)) if rng.random() < 0.5 else str(rng.randint(10**6, 10**7))
        tokens = tokenizer.convert_ids_to_tokens(tokenizer(f" is: {value}.", add_special_tokens=False)["input_ids"])
        assert set(tokens) <= alphabet, (value, set(tokens) - alphabet)
    assert len(alphabet) == len(CR.alphabet(tokenizer))  # no token twice: one-hot dims are one per token


def test_match_codes_are_unit_and_far_apart():
    """A mismatch scores (1 + m) * cosine - m: codes must be unit and no pair close to parallel."""
    weights = [1.0] * 19 + [0.5] * 80
    codes = CR.match_codes(len(weights), CR.DU, weights, seed=0, steps=1500)
    assert np.allclose(codes.norm(dim=-1).numpy(), 1.0, atol=1e-5)
    cos = (codes @ codes.T).abs().fill_diagonal_(0)
    assert cos.max() < 0.5
    assert cos[:19, :19].max() < 0.3  # the frequent ones (digits, a-f, separators) furthest apart
