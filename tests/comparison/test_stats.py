"""Statistics behind the gate and the seed summaries: correct numbers and honest edge cases."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from pytest_kvbench.stats import (
    bootstrap_mean,
    coefficient_of_variation,
    compare_paired,
    paired_bootstrap,
    paired_ttest,
    seed_summary,
    seeds_needed,
    stratified_bootstrap_mean,
    variation_curve,
)

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


def test_identical_samples_give_a_zero_width_interval_at_zero():
    scores = [1, 0, 1, 0.5, 0.25]
    assert paired_bootstrap(scores, scores) == (0.0, 0.0, 0.0)
    assert paired_ttest(scores, scores) == (0.0, 1.0)


def test_same_shift_on_every_sample_is_certain():
    a = [0.2, 0.4, 0.6]
    b = [x - 0.1 for x in a]
    mean, low, high = paired_bootstrap(a, b)
    assert mean == pytest.approx(-0.1) and low == pytest.approx(-0.1) and high == pytest.approx(-0.1)
    t, p = paired_ttest(a, b)
    assert t == -math.inf and p == 0.0


def test_clear_drop_has_an_interval_below_zero_and_a_small_p():
    rng = np.random.default_rng(1)
    a = rng.uniform(0.4, 1.0, size=80)
    b = a - rng.uniform(0.1, 0.3, size=80)
    result = compare_paired(a, b)
    assert result.high < 0 and result.significant_drop and not result.significant_rise
    assert result.low < result.mean_diff < result.high
    assert result.p < 1e-6 and result.t < 0
    assert result.n == 80


def test_difference_is_current_minus_baseline():
    mean, _, high = paired_bootstrap([0, 0, 0, 0], [1, 1, 0, 1])
    assert mean == pytest.approx(0.75)
    assert high > 0


def test_bootstrap_is_reproducible_for_a_seed_and_varies_across_seeds():
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 2, 60), rng.integers(0, 2, 60)
    assert paired_bootstrap(a, b, seed=7) == paired_bootstrap(a, b, seed=7)
    assert paired_bootstrap(a, b, seed=7)[1:] != paired_bootstrap(a, b, seed=8)[1:]


def test_single_differing_pair_does_not_make_the_drop_significant():
    a = [1.0] * 50
    b = [1.0] * 49 + [0.0]
    mean, _, high = paired_bootstrap(a, b)
    assert mean == pytest.approx(-0.02)
    assert not high < 0


def test_single_pair_has_no_interval():
    mean, low, high = paired_bootstrap([1.0], [0.0])
    assert mean == -1.0 and math.isnan(low) and math.isnan(high)
    assert all(math.isnan(v) for v in paired_ttest([1.0], [0.0]))


def test_noise_alone_rarely_looks_significant():
    """Under no true difference the 95% interval excludes zero about 5% of the time, not more."""
    rng = np.random.default_rng(11)
    false_alarms = 0
    trials = 120
    for trial in range(trials):
        quality = rng.uniform(0, 1, size=40)
        a = (rng.uniform(size=40) < quality).astype(float)
        b = (rng.uniform(size=40) < quality).astype(float)
        _, low, high = paired_bootstrap(a, b, n_resamples=2000, seed=trial)
        false_alarms += high < 0 or low > 0
    assert false_alarms / trials <= 0.1


def test_ttest_matches_scipy_on_ordinary_data():
    rng = np.random.default_rng(5)
    a = rng.normal(size=30)
    b = a + rng.normal(0.2, 1.0, size=30)
    expected = scipy_stats.ttest_rel(b, a)
    assert paired_ttest(a, b) == pytest.approx((expected.statistic, expected.pvalue))


@pytest.mark.parametrize("a,b,message", [
    ([1, 2], [1], "differ in length"),
    ([], [], "empty"),
    ([1, float("nan")], [1, 2], "NaN"),
    ([[1, 2]], [[1, 2]], "one-dimensional"),
])
def test_bad_paired_input_is_refused(a, b, message):
    with pytest.raises(ValueError, match=message):
        paired_bootstrap(a, b)


def test_seed_summary_uses_the_t_interval():
    mean, low, high = seed_summary([1.0, 2.0, 3.0])
    half = scipy_stats.t.ppf(0.975, 2) * 1.0 / math.sqrt(3)
    assert mean == 2.0
    assert (low, high) == pytest.approx((2.0 - half, 2.0 + half))


def test_seed_summary_of_one_seed_has_unknown_spread():
    mean, low, high = seed_summary([42.0])
    assert mean == 42.0 and math.isnan(low) and math.isnan(high)
    assert seed_summary([5.0, 5.0]) == (5.0, 5.0, 5.0)
    with pytest.raises(ValueError):
        seed_summary([])


def test_coefficient_of_variation():
    assert coefficient_of_variation([10.0, 12.0, 14.0]) == pytest.approx(2.0 / 12.0)
    assert coefficient_of_variation([3.0, 3.0]) == 0.0
    assert coefficient_of_variation([-1.0, 1.0]) == math.inf
    assert math.isnan(coefficient_of_variation([3.0]))


@pytest.mark.parametrize("cv,threshold,expected", [
    (0.02, 0.01, 4), (0.01, 0.01, 1), (0.0, 0.01, 1), (0.015, 0.01, 3), (0.03, 0.01, 9),
])
def test_seeds_needed_follows_the_square_root_law(cv, threshold, expected):
    assert seeds_needed(cv, threshold) == expected


def test_seeds_needed_is_unknown_without_a_finite_cv():
    assert seeds_needed(math.nan, 0.01) is None
    assert seeds_needed(math.inf, 0.01) is None
    with pytest.raises(ValueError):
        seeds_needed(0.1, 0)


def test_variation_curve_reports_cv_against_seed_count_and_what_is_needed():
    curve = variation_curve([50.0, 52.0, 48.0, 51.0], threshold=0.01)
    assert [k for k, _, _ in curve.points] == [2, 3, 4]
    _, cv_k, cv_mean_k = curve.points[-1]
    assert cv_k == pytest.approx(coefficient_of_variation([50.0, 52.0, 48.0, 51.0]))
    assert cv_mean_k == pytest.approx(cv_k / 2)
    assert curve.needed == seeds_needed(curve.cv, 0.01)
    assert curve.enough == (curve.needed <= 4)
    loose = variation_curve([50.0, 52.0, 48.0, 51.0], threshold=0.05)
    assert loose.needed == 1 and loose.enough
    single = variation_curve([50.0], threshold=0.01)
    assert single.points == () and single.needed is None and not single.enough


def test_stratified_bootstrap_of_one_group_is_the_plain_bootstrap():
    values = [0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    assert stratified_bootstrap_mean([values], n_resamples=2_000) == bootstrap_mean(values, n_resamples=2_000)


def test_stratified_bootstrap_weights_tasks_equally_and_keeps_their_spread_apart():
    """Mean of the task means (not of the pooled samples); the spread is each task's own: a task where every
    sample agrees adds none, so the interval matches the normal approximation of the varying task alone."""
    varying = [float(i % 2) for i in range(40)]  # mean 0.5, sd 0.5
    constant = [1.0] * 10
    mean, low, high = stratified_bootstrap_mean([varying, constant])
    assert mean == pytest.approx(0.75)  # the pooled mean would be 0.6
    expected_half = 1.96 * 0.5 / math.sqrt(40) / 2  # the varying task's half-width, halved by the average
    assert (high - low) / 2 == pytest.approx(expected_half, rel=0.2)
    pooled = bootstrap_mean(varying + constant)
    assert (pooled[2] - pooled[1]) / 2 > 1.3 * (high - low) / 2  # pooling mixes the tasks' difference into it


def test_stratified_bootstrap_edge_cases():
    assert stratified_bootstrap_mean([[1.0, 1.0], [0.0, 0.0]]) == (0.5, 0.5, 0.5)
    mean, low, high = stratified_bootstrap_mean([[1.0, 0.0], [1.0]])
    assert mean == 0.75 and math.isnan(low) and math.isnan(high)  # a task of one sample: its spread is unknown
    for bad in ([], [[]], [[1.0], []]):
        with pytest.raises(ValueError):
            stratified_bootstrap_mean(bad)
