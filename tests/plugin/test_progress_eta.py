"""The session ETA under shared prefill: a group's first item pays for the group (fake clock: times are given)."""

import pytest

from pytest_kvbench.wiring.progress.eta import GroupedEstimate, PlannedItem

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

MEMBERS = 15  # full + 7 methods x 2 budgets: the default job's reference group when the seconds below were measured


def default_job(groups):
    """(planned items, true seconds of each) for groups of MEMBERS items run in order: the first item of a
    group does its prefills and every member's decoding; the others only score."""
    planned, seconds = [], []
    for name, samples, tokens, first_seconds in groups:
        for member in range(MEMBERS):
            planned.append(PlannedItem(f"{name}-{member}", name, samples, tokens))
            seconds.append(first_seconds if member == 0 else 0.2)
    return planned, seconds


def replay(planned, seconds, samples_run):
    """(item index, sample done, shown remaining, real remaining) at each item's start and after each sample
    of the first items, driving the estimate the way the progress line does."""
    estimate = GroupedEstimate(planned)
    points = []
    for index, (item, took) in enumerate(zip(planned, seconds)):
        estimate.start(item.key)
        total = samples_run[item.group]
        for done in range(total + 1):
            elapsed = took * done / total
            shown = estimate.remaining(item.key, done, total, elapsed)
            points.append((index, done, shown, sum(seconds[index:]) - elapsed))
        estimate.finish(item.key, took, total, item.prompt_tokens or 1200)
    return points


# lcc (fixtures: 6 samples of ~1,200 tokens) and three niah groups at 2,048 tokens, 20 samples:
# the default job's shape, with its measured first-item seconds.
GROUPS = [("lcc", 20, None, 16.7), ("niah_single_1", 20, 2048, 100.0), ("niah_multikey_2", 20, 2048, 151.0),
          ("niah_multikey_3", 20, 2048, 112.7)]
SAMPLES_RUN = {"lcc": 6, "niah_single_1": 20, "niah_multikey_2": 20, "niah_multikey_3": 20}


def test_past_a_fifth_of_the_run_the_estimate_is_within_a_factor_of_2():
    planned, seconds = default_job(GROUPS)
    points = replay(planned, seconds, SAMPLES_RUN)
    checked = [(i, d, shown, real) for i, d, shown, real in points if i >= 0.2 * len(planned) and real > 1.0]
    assert checked
    for index, done, shown, real in checked:
        assert real / 2 <= shown <= 2 * real, (index, done, shown, real)


def test_items_left_times_the_mean_item_is_what_misleads():
    """The old estimate (items left x mean finished item) on the same run is off by far more than 2x."""
    planned, seconds = default_job(GROUPS)
    index = MEMBERS  # niah_single_1's first item starts: a quarter of the items and one cheap group behind
    naive = (len(planned) - index) * sum(seconds[:index]) / index
    assert 2 * naive < sum(seconds[index:])


def test_a_first_item_counts_for_its_group_and_later_items_for_themselves():
    planned = [PlannedItem(f"a{i}", "a", 10, 100) for i in range(3)] + [PlannedItem(f"b{i}", "b", 10, 100)
                                                                        for i in range(3)]
    estimate = GroupedEstimate(planned)
    assert estimate.remaining() is None  # nothing measured yet
    estimate.start("a0")
    assert estimate.remaining("a0", 5, 10, 30.0) == pytest.approx(30.0 + 60.0)  # itself + group b alike
    estimate.finish("a0", 60.0, 10, 100)
    estimate.start("a1")
    estimate.finish("a1", 1.0, 10, 100)
    assert estimate.remaining() == pytest.approx(1.0 + 60.0)  # a2 as a later item, b as a whole group


def test_without_sharing_every_item_is_its_own_group():
    planned = [PlannedItem(f"x{i}", f"x{i}", 4, 512) for i in range(4)]
    estimate = GroupedEstimate(planned)
    for key in ("x0", "x1"):
        estimate.start(key)
        estimate.finish(key, 8.0, 4, 512)
    assert estimate.remaining() == pytest.approx(16.0)


def test_longer_prompts_are_expected_to_cost_more():
    planned = [PlannedItem("short", "s", 10, 500), PlannedItem("long", "l", 10, 2000)]
    estimate = GroupedEstimate(planned)
    estimate.start("short")
    estimate.finish("short", 5.0, 10, 500)
    assert estimate.remaining() == pytest.approx(20.0)


def test_an_item_that_prefills_alone_is_priced_as_a_prefill_not_as_a_group_members_share():
    """The real-model log showed "session ETA 1s" with three kvzip items of a minute each left: an item alone
    (its own group) was priced at a 36-member group's cost per member and sample."""
    group = [PlannedItem(f"g{i}", "g", 10, 2048) for i in range(36)]
    alone = [PlannedItem(f"z{i}", f"z{i}", 10, 2048) for i in range(2)]
    estimate = GroupedEstimate(group + alone)
    estimate.start("g0")
    estimate.finish("g0", 72.0, 10, 2048)  # one prefill per sample + 36 decodes: 7.2 s per sample
    for i in range(1, 36):
        estimate.start(f"g{i}")
        estimate.finish(f"g{i}", 0.1, 10, 2048)
    real_left = 2 * 40.0  # each alone item: its own prefill and decoding, 4 s per sample
    shown = estimate.remaining()
    assert real_left <= shown <= 2 * real_left  # no item alone measured yet: a whole group's rate, an upper bound
    estimate.start("z0")
    assert estimate.remaining("z0", 5, 10, 20.0) == pytest.approx(20.0 + 40.0)  # itself projected, z1 alike
    estimate.finish("z0", 40.0, 10, 2048)
    assert estimate.remaining() == pytest.approx(40.0)  # priced at the item alone measured


def test_a_group_before_any_group_was_measured_is_priced_at_an_item_alone_per_sample():
    planned = [PlannedItem("z0", "z0", 4, 1024)] + [PlannedItem(f"g{i}", "g", 8, 2048) for i in range(5)]
    estimate = GroupedEstimate(planned)
    estimate.start("z0")
    estimate.finish("z0", 8.0, 4, 1024)  # 2 s per sample of 1,024 tokens
    assert estimate.remaining() == pytest.approx(8 * 2.0 * 2)  # 8 samples, twice the tokens: one prefill each


def test_the_plan_asks_each_method_whether_it_shares_the_groups_forward():
    """kvzip and the quantizers share their group's forward (kvmethods.runtime.shared_prefill); ThinK (it reads the
    prompt's last queries) and a chunked prefill change the forward and prefill alone."""
    from kvmethods import FULL_CACHE, Budget
    from kvmethods.spec import MethodSpec
    from pytest_kvbench.cases import Case
    from pytest_kvbench.engine.case_methods import shares_prefill  # lazy: the engine imports torch (startup tests above)

    def case(method, params=(), budget="m0.125"):
        budget = FULL_CACHE if method == "full" else Budget.parse(budget)
        return Case("m", MethodSpec(method, params), budget, "niah_single_1", "ruler", 2048, 0, 8)

    assert all(shares_prefill(case(m)) for m in ("full", "snapkv", "kvzip", "kivi", "snapkv+kivi", "adakv"))
    assert not shares_prefill(case("think"))
    assert not shares_prefill(case("snapkv", (("prefill_chunk", 512),)))


# -- batched decoding: a group's first sample decodes every member alone, the later ones in one batch ---------

def test_after_the_first_batched_sample_the_item_is_projected_at_the_batched_rate_not_the_mean():
    """The real-model job's shape: the first sample decodes 33 members alone (60 s), each later one decodes
    them in one batch (10 s). Projecting the mean after sample 2 (35 s a sample) would show 28 x 35 s left."""
    planned = [PlannedItem(f"g{i}", "g", 30, 2048) for i in range(34)]
    estimate = GroupedEstimate(planned)
    estimate.start("g0")
    estimate.sample("g0", 60.0, batched=False)
    estimate.sample("g0", 10.0, batched=True)
    later_items = 33 * 0.0  # nothing measured for them yet
    assert estimate.projected("g0", 2, 30, 70.0) == pytest.approx(60.0 + 29 * 10.0)
    assert estimate.remaining("g0", 2, 30, 70.0) == pytest.approx(28 * 10.0 + later_items)


def test_without_a_batched_sample_the_item_is_projected_at_its_mean_rate():
    estimate = GroupedEstimate([PlannedItem("a", "a", 10, 100)])
    estimate.start("a")
    for _ in range(2):
        estimate.sample("a", 4.0, batched=False)
    assert estimate.projected("a", 2, 10, 8.0) == pytest.approx(40.0)
    assert estimate.remaining("a", 2, 10, 8.0) == pytest.approx(32.0)


def test_a_group_not_started_pays_its_opening_per_member_and_its_later_samples_once_each():
    """Group g (10 members) measured: opening 20 s (2 s a member alone), then 5 s a batched sample. Group h has
    4 members and 20 samples of twice the tokens: opening 4 x 2 s, 19 batched samples at 5 s, all x 2."""
    planned = [PlannedItem(f"g{i}", "g", 10, 1000) for i in range(10)] + [PlannedItem(f"h{i}", "h", 20, 2000)
                                                                          for i in range(4)]
    estimate = GroupedEstimate(planned)
    estimate.start("g0")
    estimate.sample("g0", 20.0, batched=False)
    for _ in range(9):
        estimate.sample("g0", 5.0, batched=True)
    estimate.finish("g0", 65.0, 10, 1000)
    for i in range(1, 10):
        estimate.start(f"g{i}")
        estimate.finish(f"g{i}", 0.0, 10, 1000)
    assert estimate.remaining() == pytest.approx((4 * 2.0 + 19 * 5.0) * 2)


def test_samples_decoded_ahead_average_into_the_batched_rate():
    """Batching across samples: one sample decodes the members of three samples, the two after find theirs."""
    estimate = GroupedEstimate([PlannedItem("a", "g", 9, 100), PlannedItem("b", "g", 9, 100)])
    estimate.start("a")
    for seconds, batched in [(30.0, False), (12.0, True), (0.0, True), (0.0, True)]:
        estimate.sample("a", seconds, batched)
    assert estimate.projected("a", 4, 9, 42.0) == pytest.approx(30.0 + 8 * 4.0)


def test_a_batch_across_samples_counts_as_the_samples_it_decoded():
    """A -n 2 real-model run: a part's host decoded sample 1's members alone (30.7 s), then prefilled 21 samples
    and decoded their members in one batch (508.4 s), and found the next 20 samples' members decoded. Read as
    one sample, the batch projected 28 x 508 s (3h57m) with about 4 minutes left."""
    estimate = GroupedEstimate([PlannedItem("a", "g", 30, 2048), PlannedItem("b", "g", 30, 2048)])
    estimate.start("a")
    estimate.sample("a", 30.7, batched=False)
    estimate.sample("a", 508.4, batched=True, covers=21)
    steady = 508.4 / 21
    assert estimate.projected("a", 2, 30, 539.1) == pytest.approx(30.7 + 29 * steady)
    left_after_2 = estimate.remaining("a", 2, 30, 539.1)
    assert left_after_2 == pytest.approx(30.7 + 29 * steady - 539.1)  # b: a later item, nothing measured yet
    assert left_after_2 < 10 * 60
    for done in range(3, 23):  # samples 3-22: their members were in that batch
        estimate.sample("a", 0.01, batched=False)
    assert estimate.projected("a", 22, 30, 539.3) == pytest.approx(539.3 + 8 * steady)
    estimate.sample("a", 8 * 24.0, batched=True, covers=8)  # the last 8 samples in a second batch
    assert estimate.batching("a").steady == pytest.approx((508.4 + 8 * 24.0) / 29)
