"""The RoPE kernels that scripts/compile_retrieval.py designs for the default model's key-matching circuit.

The bag head needs a flat window (every key token of a needle weighs the same, so the question's bag
equals the needle's) and the carry head needs a kernel that always prefers the latest anchor; both
must hold out to 8,192 tokens, where RoPE's periodic terms could bring a far position back."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import compile_retrieval as CR  # noqa: E402


def kernel(pairs, a, b, d):
    w = CR._freqs(pairs)
    return np.cos(np.outer(d, w)) @ a + np.sin(np.outer(d, w)) @ b


def test_window_kernel_is_flat_inside_and_far_below_outside():
    width = int(CR.DEFAULTS["window"])
    a, b, t = CR.window_kernel(CR.ODD, width=width)
    inside = kernel(CR.ODD, a, b, np.arange(1, width + 1))
    outside = kernel(CR.ODD, a, b, np.arange(width + 4, 8193))
    assert t > 8
    assert np.ptp(inside) <= 1.0 + 1e-6
    assert outside.max() <= inside.min() - 8


def test_recency_kernel_prefers_the_latest_anchor_at_any_distance():
    a, b, t = CR.recency_kernel(CR.FAST, span=64, gap=3)
    f = kernel(CR.FAST, a, b, np.arange(0, 8193))
    assert t > 5
    near = f[:65]
    assert np.all(near[:-3] - near[3:] >= t - 1e-6)  # 3 tokens nearer always wins by t
    assert f[68:].max() <= near[-1] - t + 1e-6  # nothing beyond the span outscores its end


def test_old_heads_keep_their_rope_frequencies():
    """Trained pair j (head_dim 32, theta 1e10) lands on pair 2j (head_dim 128, theta 1e20): same frequency."""
    old = 1e10 ** (-np.arange(16) * 2 / 32)
    rows = CR._old_rows(0)[:16]
    assert np.allclose(CR._freqs(rows), old)


@pytest.mark.parametrize("at", [1, 2, 3])
def test_previous_token_kernels_peak_where_they_should(at):
    a, b, t = CR.peak_kernel(CR.ODD, at)
    f = kernel(CR.ODD, a, b, np.arange(0, 8193))
    assert t > 20
    assert int(np.argmax(f)) == at
    assert np.sort(f)[-2] <= f[at] - t + 1e-6
