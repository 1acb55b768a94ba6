"""RoPE kernels for stage 4 of the default model's recipe (compile_retrieval.py), designed by linear programming.

A kernel is a query/key weight pattern over RoPE pairs whose attention score depends only on the distance
between positions: score(delta) = sum_i a_i cos(w_i delta) + b_i sin(w_i delta). compile_retrieval.py sets
the compiled heads' weights from these (_put_kernel): a flat window (the key bag), a falling recency and a
single peak.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import linprog

HEAD, THETA = 128, 1e20  # the compiled model's head dimension and RoPE base


def _freqs(pairs):
    return THETA ** (-2.0 * np.asarray(pairs) / HEAD)


def _features(pairs, d):
    w = _freqs(pairs)
    return np.concatenate([np.cos(np.outer(d, w)), np.sin(np.outer(d, w)), np.ones((len(d), 1))], 1)


def _far(maxd=8192):
    return np.arange(0, maxd + 1)


def _maximise_margin(n_coef, ge, le, bound):
    """max t s.t. F x >= lo + s t (ge rows), F x <= hi - s t (le rows), |x| <= bound."""
    A = [np.concatenate([-F, s[:, None]], 1) for F, lo, s in ge] + [np.concatenate([F, s[:, None]], 1) for F, hi, s in le]
    b = [-lo for F, lo, s in ge] + [hi for F, hi, s in le]
    c = np.zeros(n_coef + 1)
    c[-1] = -1
    res = linprog(c, A_ub=np.concatenate(A), b_ub=np.concatenate(b), bounds=[(-bound, bound)] * n_coef + [(0, None)],
                  method="highs")
    if res.status != 0:
        raise RuntimeError(f"kernel design failed: {res.message}")
    x = res.x
    n = (n_coef - 1) // 2
    return x[:n], x[n:2 * n], x[-1]


def window_kernel(pairs, width, gap=4, band=0.5, bound=100.0):
    """Flat (within +-band) for delta in [1, width]; at least t below it from width+gap on. Returns (a, b, t)."""
    d_in = np.arange(1, width + 1)
    d_out = _far()
    d_out = d_out[d_out >= width + gap]
    Fi, Fo, z = _features(pairs, d_in), _features(pairs, d_out), np.zeros(len(d_in))
    return _maximise_margin(2 * len(pairs) + 1, ge=[(Fi, z - band, z)],
                            le=[(Fi, z + band, z), (Fo, np.zeros(len(d_out)), np.ones(len(d_out)))], bound=bound)


def recency_kernel(pairs, span=64, gap=3, bound=50.0):
    """Falls by at least t every `gap` tokens over [0, span]; beyond span it stays t below its value at span."""
    d0 = np.arange(0, span + 1)
    d_out = _far()
    d_out = d_out[d_out > span + gap]
    Fd = _features(pairs, d0) - _features(pairs, d0 + gap)
    Fo = _features(pairs, d_out) - _features(pairs, np.array([span]))
    return _maximise_margin(2 * len(pairs) + 1, ge=[(Fd, np.zeros(len(d0)), np.ones(len(d0)))],
                            le=[(Fo, np.zeros(len(d_out)), np.ones(len(d_out)))], bound=bound)


def peak_kernel(pairs, at, bound=200.0):
    """Highest at delta == at, by at least t over every other delta up to 8,192. Returns (a, b, t)."""
    d = np.arange(0, 8193)
    d = d[d != at]
    F = _features(pairs, d) - _features(pairs, np.array([at]))
    return _maximise_margin(2 * len(pairs) + 1, ge=[], le=[(F, np.zeros(len(d)), np.ones(len(d)))], bound=bound)


def _put_kernel(q_w, k_w, q_head, kv_head, a, b, src, src_value, pairs):
    """q and k read the constant dim `src` (normalised value src_value) so that q.k = the kernel of delta."""
    s = math.sqrt(HEAD)  # cancels attention's 1/sqrt(head_dim)
    for j, i in enumerate(pairs):
        q_w[q_head * HEAD + i, src] = a[j] * s / src_value
        q_w[q_head * HEAD + i + HEAD // 2, src] = -b[j] * s / src_value
        k_w[kv_head * HEAD + i, src] = 1.0 / src_value
