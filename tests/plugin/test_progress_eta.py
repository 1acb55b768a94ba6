"""The session ETA under shared prefill: a group's first item pays for the group (fake clock: times are given)."""

import pytest

from pytest_kvbench.wiring.progress_eta import GroupedEstimate, PlannedItem

MEMBERS = 15  # full + 7 methods x 2 budgets: the default job's reference group


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
