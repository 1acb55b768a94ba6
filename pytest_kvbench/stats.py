"""Statistics for comparing benchmark results: paired bootstrap, paired t-test, seed spread.

Why paired: two runs of the same item score the *same* samples, so per-sample differences remove
the (large) difficulty variation between samples and leave only the effect of the change. Both
sides must therefore be aligned by sample id before they reach this module (see verdicts.py).

Conventions: ``a`` is the reference (baseline) and ``b`` the candidate (current run); every
difference is ``b - a``, so a negative score difference is a drop. Pure numpy/scipy, no I/O. It sits below
results/ (intervals in tables and figures) and comparison/ (verdicts), which both use it.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _scipy_stats

DEFAULT_RESAMPLES = 10_000
DEFAULT_CONFIDENCE = 0.95
_BATCH = 256  # resamples per vectorised step: ~20 MiB for 2,000 samples instead of 600 MiB


def _as_pair(a: Sequence[float], b: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    """Validate two paired samples and return them as float arrays of equal length."""
    left = np.asarray(a, dtype=float)
    right = np.asarray(b, dtype=float)
    if left.ndim != 1 or right.ndim != 1:
        raise ValueError("paired samples must be one-dimensional")
    if left.shape != right.shape:
        raise ValueError(f"paired samples differ in length ({left.size} vs {right.size})")
    if left.size == 0:
        raise ValueError("paired samples are empty")
    if not (np.all(np.isfinite(left)) and np.all(np.isfinite(right))):
        raise ValueError("paired samples contain NaN or infinite values")
    return left, right


def _all_equal(values: np.ndarray) -> bool:
    """Equal up to float rounding (0.4 - 0.1 and 0.2 - 0.1 are not bit-identical)."""
    scale = max(1.0, float(np.max(np.abs(values))))
    return float(np.ptp(values)) <= 1e-12 * scale


def paired_bootstrap(
    a: Sequence[float],
    b: Sequence[float],
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Mean of ``b - a`` and its bootstrap confidence interval, resampling whole pairs.

    Returns ``(mean_diff, low, high)``. The interval is BCa (better coverage than percentile on
    the skewed, discrete per-sample scores of LongBench/RULER); when BCa is undefined (e.g. one
    single differing pair) the percentile interval is used instead. When every difference is the
    same there is no sampling uncertainty and the interval collapses to that value. With a
    single pair no interval exists and ``low``/``high`` are NaN, which never counts as
    significant. A fixed ``seed`` makes the gate reproducible: the same two runs always get
    the same verdict.
    """
    left, right = _as_pair(a, b)
    # Resampling the per-pair differences is resampling whole pairs (the statistic only sees b - a).
    return bootstrap_mean(right - left, n_resamples=n_resamples, confidence=confidence, seed=seed)


def bootstrap_mean(
    values: Sequence[float],
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Mean of ``values`` and its bootstrap confidence interval (BCa, else percentile): how far the
    mean of one item's per-sample scores could move with other samples of the same task.

    Equal values give a collapsed interval (no sampling spread was seen), a single value NaN
    bounds (the spread is unknown). A fixed ``seed`` makes it reproducible.
    """
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return math.nan, math.nan, math.nan
    return stratified_bootstrap_mean((data,), n_resamples, confidence, seed)  # one stratum: the plain bootstrap


def stratified_bootstrap_mean(
    groups: Sequence[Sequence[float]],
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Mean over ``groups`` of each group's mean, and its bootstrap interval resampling every group on its own.

    A method's score averaged over tasks weights each task equally; the tasks are fixed and only their samples
    could have been others, so each task's samples are resampled within that task (strata), never pooled: a
    pooled bootstrap would let one task's samples stand in for another's and mix the tasks' difficulty into the
    spread. Equal values in every group give a collapsed interval; a group of one value NaN bounds.
    """
    arrays = tuple(np.asarray(g, dtype=float) for g in groups)
    if not arrays or any(a.ndim != 1 or a.size == 0 for a in arrays):
        raise ValueError("every group needs at least one value")
    mean = float(np.mean([a.mean() for a in arrays]))
    if any(a.size < 2 for a in arrays):
        return mean, math.nan, math.nan
    if all(_all_equal(a) for a in arrays):
        return mean, mean, mean

    def mean_of_means(*samples: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.mean([np.mean(x, axis=axis) for x in samples], axis=0)

    return (mean, *_bootstrap_interval(arrays, mean_of_means, n_resamples, confidence, seed))


def _bootstrap_interval(data: tuple[np.ndarray, ...], statistic, n_resamples: int, confidence: float,
                        seed: int) -> tuple[float, float]:
    """scipy's bootstrap interval of ``statistic`` (BCa, else percentile where BCa gives no finite bounds), each
    array of ``data`` resampled on its own; NaN bounds when neither does."""
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # batching bounds memory for items with many samples
            result = _scipy_stats.bootstrap(
                data,
                statistic,
                vectorized=True,
                paired=False,
                batch=_BATCH,
                n_resamples=n_resamples,
                confidence_level=confidence,
                method=method,
                rng=np.random.default_rng(seed),
            )
        low, high = result.confidence_interval
        if math.isfinite(low) and math.isfinite(high):
            return float(low), float(high)
    return math.nan, math.nan


def paired_ttest(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Paired t-test of ``b - a`` against zero: ``(t, two-sided p)``.

    Reported next to the bootstrap interval as a familiar second opinion. scipy returns NaN
    when all differences are equal; that case is resolved here: no difference at all gives
    ``(0, 1)``, an identical non-zero shift on every sample gives ``(±inf, 0)``. Fewer than two
    pairs give ``(nan, nan)``.
    """
    left, right = _as_pair(a, b)
    differences = right - left
    if left.size < 2:
        return math.nan, math.nan
    if _all_equal(differences):
        if _all_equal(np.append(differences, 0.0)):
            return 0.0, 1.0
        return math.copysign(math.inf, float(np.mean(differences))), 0.0
    result = _scipy_stats.ttest_rel(right, left)
    return float(result.statistic), float(result.pvalue)


@dataclass(frozen=True)
class PairedResult:
    """Bootstrap interval and t-test of one paired comparison, reported together."""

    n: int
    mean_diff: float
    low: float
    high: float
    t: float
    p: float

    @property
    def significant_drop(self) -> bool:
        """The whole interval lies below zero (NaN bounds never qualify)."""
        return self.high < 0

    @property
    def significant_rise(self) -> bool:
        """The whole interval lies above zero (NaN bounds never qualify)."""
        return self.low > 0


def compare_paired(
    a: Sequence[float],
    b: Sequence[float],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> PairedResult:
    """Run both paired tests on the same data so that callers never report one without the other."""
    mean_diff, low, high = paired_bootstrap(a, b, n_resamples=n_resamples, confidence=confidence, seed=seed)
    t, p = paired_ttest(a, b)
    return PairedResult(n=len(a), mean_diff=mean_diff, low=low, high=high, t=t, p=p)


def seed_summary(values: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float, float]:
    """Mean over repeated runs (one value per seed) and its Student-t confidence interval.

    Seeds are few (typically 3-5), so the t distribution, not a bootstrap, is the honest
    interval. One seed gives ``(value, nan, nan)``: the spread is unknown, not zero.
    """
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values to summarise")
    mean = float(np.mean(data))
    if data.size < 2:
        return mean, math.nan, math.nan
    sem = float(np.std(data, ddof=1)) / math.sqrt(data.size)
    if sem == 0:
        return mean, mean, mean
    half_width = float(_scipy_stats.t.ppf(0.5 + confidence / 2, df=data.size - 1)) * sem
    return mean, mean - half_width, mean + half_width


def coefficient_of_variation(values: Sequence[float]) -> float:
    """Sample standard deviation over the absolute mean (a fraction, not a percentage).

    NaN with fewer than two values (no spread can be estimated); infinite when the mean is zero
    and the values vary (relative spread is unbounded), zero when they do not vary at all.
    """
    data = np.asarray(values, dtype=float)
    if data.size < 2:
        return math.nan
    spread = float(np.std(data, ddof=1))
    mean = abs(float(np.mean(data)))
    if spread == 0:
        return 0.0
    if mean == 0:
        return math.inf
    return spread / mean


def seeds_needed(cv: float, threshold: float) -> int | None:
    """Smallest number of seeds whose averaged result has a coefficient of variation <= threshold.

    Averaging k independent seeds divides the standard deviation by sqrt(k), so the mean of k
    seeds has ``cv / sqrt(k)``; the answer is ``ceil((cv / threshold)**2)``, at least 1. None
    when ``cv`` is unknown (NaN) or infinite.
    """
    if threshold <= 0:
        raise ValueError("threshold must be positive")
    if not math.isfinite(cv):
        return None
    ratio = (cv / threshold) ** 2
    return max(1, math.ceil(ratio - 1e-9))


@dataclass(frozen=True)
class VariationCurve:
    """How the variation of one configuration's score behaves as seeds are added.

    ``points`` holds, for k = 2..n (seeds taken in the order given), the coefficient of
    variation of the first k per-seed values and the resulting cv of their mean
    (``cv_k / sqrt(k)``). ``cv`` uses all seeds, the best estimate of the spread, and
    ``needed`` is the projected number of seeds for the mean's cv to fall under ``threshold``.
    """

    n: int
    mean: float
    cv: float
    threshold: float
    needed: int | None
    points: tuple[tuple[int, float, float], ...]

    @property
    def enough(self) -> bool:
        """The seeds already run are sufficient for the threshold."""
        return self.needed is not None and self.needed <= self.n


def variation_curve(values: Sequence[float], threshold: float) -> VariationCurve:
    """Coefficient of variation against the number of seeds, plus the projected seeds needed."""
    data = [float(v) for v in values]
    if not data:
        raise ValueError("no values")
    points = []
    for k in range(2, len(data) + 1):
        cv_k = coefficient_of_variation(data[:k])
        points.append((k, cv_k, cv_k / math.sqrt(k)))
    cv = coefficient_of_variation(data)
    return VariationCurve(
        n=len(data),
        mean=float(np.mean(data)),
        cv=cv,
        threshold=threshold,
        needed=seeds_needed(cv, threshold) if len(data) >= 2 else None,
        points=tuple(points),
    )
