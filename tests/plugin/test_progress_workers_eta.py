"""The xdist controller's session ETA over sharing groups, driven by fake snapshots and reports (no clock)."""

from __future__ import annotations

import pytest

from pytest_kvbench.wiring.distributed.group_parts import sharing_groups
from pytest_kvbench.wiring.progress.text import mean_item_left
from pytest_kvbench.wiring.progress.workers_eta import Running, WorkersEstimate
from test_xdist_scheduling import grid

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


def within(estimate: float | None, actual: float, factor: float = 1.5) -> bool:
    return estimate is not None and actual / factor <= estimate <= actual * factor


def real_job() -> WorkersEstimate:
    """The 34-item real-model job under -n 2: one reference group cut into two parts, one per worker
    (18 and 16 items), each part's first item decoding the part's members for 30 samples."""
    groups = {f"a{i}": "niah|part1of2" for i in range(18)} | {f"b{i}": "niah|part2of2" for i in range(16)}
    return WorkersEstimate(groups)


def test_the_real_job_under_two_workers_reads_minutes_where_the_mean_read_hours():
    """The log: part a's first item passed at 672.9 s, "items 1/34, session ETA 3h03m"; part b's first item at
    909.2 s, "items 19/34, session ETA 20m43s" as the run ended. Each part's later items take about 0 s."""
    eta = real_job()
    eta.start("a0")
    eta.start("b0")
    assert eta.remaining([], workers=2) is None  # nothing measured yet
    # a minute in: each host sent its second sample (rates as in the run: 30 samples in 673 s and 909 s)
    early = [Running("a0", 2, 30, 672.9 / 30, 45.0), Running("b0", 2, 30, 909.2 / 30, 60.6)]
    assert within(eta.remaining(early, workers=2), 909.2 - 60.6)
    # 672.9 s: a's host passed; b's host is at sample 22 of 30
    eta.finish("a0", 672.9)
    at_first = [Running("b0", 22, 30, 909.2 / 30, 666.8)]
    left = eta.remaining(at_first, workers=2)
    assert within(left, 909.2 - 672.9)
    assert mean_item_left(1, 34, 672.9, parallel=2) > 3 * 3600  # what the controller printed: hours
    # a's later items pass in no time: the estimate stays b's host's time left, not a falling mean
    for i in range(1, 18):
        eta.start(f"a{i}")
        eta.finish(f"a{i}", 0.05)
        assert eta.remaining(at_first, workers=2) == pytest.approx(left, abs=1.0)
    # 909.2 s: b's host passed, 15 items of ~0 s left ("items 19/34, session ETA 20m43s" before)
    # (gw0 had gone: its channel closed, one worker connected)
    eta.finish("b0", 909.2)
    assert eta.remaining([], workers=1) < 1.0
    assert mean_item_left(19, 34, 672.9 + 909.2 + 17 * 0.05, parallel=1) > 20 * 60


def test_one_group_cut_in_two_parts_by_group_parts():
    """group_parts' cut of one group for two workers: kvzip's part and the others'; each part's host decodes
    its part, so the session lasts as long as the slower host."""
    cases = grid()
    parts = sharing_groups(cases, 2)
    eta = WorkersEstimate({case.id: parts[case.key] for case in cases})
    kvzip = [case.id for case in cases if case.method.name == "kvzip"]
    others = [case.id for case in cases if case.method.name != "kvzip"]
    eta.start(others[0])
    eta.start(kvzip[0])
    running = [Running(others[0], 5, 20, 10.0, 60.0), Running(kvzip[0], 4, 20, 20.0, 90.0)]
    assert eta.remaining(running, workers=2) == pytest.approx(16 * 20.0)  # kvzip's host: the longer
    eta.finish(others[0], 200.0)
    for item in others[1:]:  # the other part's later items, in no time
        eta.start(item)
        eta.finish(item, 0.1)
    # kvzip's host's time left, and its later items at the other part's later items' mean
    later = 0.1 * (len(kvzip) - 1)
    assert eta.remaining([Running(kvzip[0], 10, 20, 20.0, 210.0)], workers=2) == pytest.approx(200.0 + later)
    eta.finish(kvzip[0], 410.0)
    assert eta.remaining([], workers=2) == pytest.approx(later)


def test_eight_groups_on_two_workers_are_priced_whole_at_the_finished_groups_mean():
    groups = {f"g{g}-m{m}": f"g{g}" for g in range(8) for m in range(5)}
    eta = WorkersEstimate(groups)
    for worker_group in ("g0", "g1"):
        eta.start(f"{worker_group}-m0")
    # before a group finished: the running hosts projected (100 s each) price the 6 groups left
    running = [Running("g0-m0", 5, 10, 10.0, 50.0), Running("g1-m0", 5, 10, 10.0, 50.0)]
    assert eta.remaining(running, workers=2) == pytest.approx(50.0 + 3 * 100.0)
    for group in ("g0", "g1"):  # both groups done: hosts 100 s, later items 1 s
        for m in range(5):
            eta.start(f"{group}-m{m}")
            eta.finish(f"{group}-m{m}", 100.0 if m == 0 else 1.0)
    # 6 groups of 104 s on 2 workers: 3 each
    assert eta.remaining([], workers=2) == pytest.approx(3 * 104.0)
    # three groups left on two workers take two groups' time (a sum over the workers would say 1.5)
    for group in ("g2", "g3", "g4"):
        for m in range(5):
            eta.start(f"{group}-m{m}")
            eta.finish(f"{group}-m{m}", 100.0 if m == 0 else 1.0)
    assert eta.remaining([], workers=2) == pytest.approx(2 * 104.0)
    # a running group's host with no sample yet is priced as a host, its later items as later ones
    eta.start("g5-m0")
    assert eta.remaining([], workers=2) == pytest.approx(104.0 + 104.0)
    # one worker left: the groups queue on it
    assert eta.remaining([], workers=1) == pytest.approx(3 * 104.0)


def test_an_item_alone_costs_its_own_time_on_its_groups_worker():
    """An item whose method prefills alone (a kvpress press) is not served by its group's host."""
    groups = {"full": "g", "snapkv": "g", "press1": "g", "press2": "g"}
    eta = WorkersEstimate(groups, alone={"press1", "press2"})
    for item, seconds in (("full", 50.0), ("snapkv", 0.5), ("press1", 30.0)):
        eta.start(item)
        eta.finish(item, seconds)
    assert eta.remaining([], workers=2) == pytest.approx(30.0)  # press2, at press1's seconds
    eta.start("press2")
    assert eta.remaining([Running("press2", 1, 10, 4.0, 4.0)], workers=2) == pytest.approx(36.0)


def test_a_snapshot_before_its_start_report_and_stale_snapshots():
    eta = WorkersEstimate({"a": "g", "b": "g"})
    # the worker's snapshot came first: its item is the group's host
    assert eta.remaining([Running("a", 1, 4, 10.0, 10.0)], workers=1) == pytest.approx(30.0)
    eta.finish("a", 40.0)
    # a's last snapshot still on the board after its report: finished, not running
    assert eta.remaining([Running("a", 4, 4, 10.0, 40.0)], workers=1) == pytest.approx(0.0)
    assert eta.remaining([Running("other-test", 1, 2, 5.0)], workers=1) == pytest.approx(0.0)  # not planned


def test_running_reads_a_workers_snapshot():
    snapshot = {"item": "a", "done": 3, "total": 10, "per_sample": 2.0, "batch": None, "elapsed": 9.0,
                "items_done": 0, "items_total": 2, "items_seconds": 0.0}
    assert Running.of(snapshot) == Running("a", 3, 10, 2.0, 9.0)
    assert Running.of(dict(snapshot, item=None)) is None
    older = {k: v for k, v in snapshot.items() if k != "elapsed"}  # a worker that does not say its seconds
    assert Running.of(older).projected == pytest.approx(3 * 2.0 + 7 * 2.0)
