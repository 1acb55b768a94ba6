"""The xdist controller's board of workers' progress, driven directly: a fake clock, a real TerminalWriter."""

import io

import pytest
from _pytest._io import TerminalWriter

from pytest_kvbench.wiring.progress.board import CLEAR_ROW, RESTORE, SAVE, WorkersBoard
from pytest_kvbench.wiring.progress.workers_eta import WorkersEstimate

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

TOTAL_ITEMS = 10


class Reporter:
    """The TerminalReporter methods the board uses, over pytest's own TerminalWriter."""

    def __init__(self, tty: bool) -> None:
        self.out = io.StringIO()
        self._tw = TerminalWriter(self.out)
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty

    def write(self, content: str) -> None:
        self._tw.write(content)

    def write_line(self, line: str) -> None:
        self._tw.line(line)

    def ensure_newline(self) -> None:  # the real one ends a line it began with a file name: none here
        pass

    def write_raw(self, content: str, *, flush: bool = False) -> None:
        self._tw.write_raw(content, flush=flush)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def snapshot(item="snapkv-128-qasper", done=1, total=4, per_sample=2.0, items_done=0, items_seconds=0.0):
    return {"item": item, "done": done, "total": total, "per_sample": per_sample,
            "items_done": items_done, "items_total": TOTAL_ITEMS, "items_seconds": items_seconds}


def board(tty=False, interval=30.0, workers=("gw0", "gw1")):
    reporter, clock = Reporter(tty), Clock()
    shown = WorkersBoard(reporter, interval, clock=clock)
    for worker in workers:
        shown.connect(worker)
    return shown, reporter, clock


def test_a_log_gets_at_most_one_line_per_worker_per_interval():
    shown, reporter, clock = board()
    for now, worker, done in [(0, "gw0", 1), (10, "gw0", 2), (10, "gw1", 1), (31, "gw0", 3), (35, "gw1", 2)]:
        clock.now = now
        shown.update(worker, snapshot(done=done))
    lines = reporter.out.getvalue().splitlines()
    assert [line.split(" 2.0 s/sample")[0] for line in lines] == [
        "[kvbench] gw0 snapkv-128-qasper 1/4", "[kvbench] gw1 snapkv-128-qasper 1/4",
        "[kvbench] gw0 snapkv-128-qasper 3/4"]


def test_a_plain_line_names_the_worker_item_samples_eta_and_the_session():
    shown, reporter, _ = board(interval=0)
    shown.update("gw1", snapshot(item=None, items_done=2, items_seconds=40.0))  # idle: no line
    shown.update("gw0", snapshot(done=3, total=200, per_sample=2.1, items_done=2, items_seconds=40.0))
    # 197 samples left at 2.1 s; 4 items done in 80 s: 20 s each, 6 left over the 2 connected workers
    assert reporter.out.getvalue() == ("[kvbench] gw0 snapkv-128-qasper 3/200 2.1 s/sample ETA 6m54s; "
                                       "items 4/10, session ETA 1m00s\n")


def test_a_plain_line_says_how_the_workers_last_sample_decoded_its_groups_members():
    shown, reporter, _ = board(interval=0)
    shown.update("gw0", dict(snapshot(done=3, total=30, per_sample=10.0), batch="33 members decoded in one batch"))
    assert reporter.out.getvalue().startswith(
        "[kvbench] gw0 snapkv-128-qasper 3/30 10.0 s/sample ETA 4m30s (33 members decoded in one batch); items")


def test_a_plain_line_starts_on_a_line_of_its_own_after_dots():
    shown, reporter, _ = board(interval=0)
    with shown.terminal_turn():
        reporter.write("..")
    shown.update("gw0", snapshot())
    assert reporter.out.getvalue().startswith("..\n[kvbench] gw0 ")
    assert reporter._tw.width_of_current_line == 0  # pytest's count of the dots line starts afresh


def _last_row(reporter) -> str:
    drawn = reporter.out.getvalue().split(SAVE)[-1]
    assert drawn.endswith(RESTORE)  # back where pytest's cursor was
    return drawn.split(CLEAR_ROW)[1].split(RESTORE)[0]


def test_a_terminal_gets_one_row_for_all_busy_workers_below_pytests_cursor(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    shown, reporter, _ = board(tty=True)
    reporter.write("...")
    shown.update("gw1", snapshot(item="full-qasper"))
    shown.update("gw0", snapshot(done=2))
    assert _last_row(reporter) == ("[kvbench] gw0 snapkv-128-qasper 2/4 2.0 s/sample ETA 4s; "
                                   "gw1 full-qasper 1/4 2.0 s/sample ETA 6s; items 0/10")
    assert reporter._tw.width_of_current_line == 3  # pytest's accounting of the dots line is untouched
    monkeypatch.setenv("COLUMNS", "60")
    shown.update("gw0", snapshot(done=3))
    assert len(_last_row(reporter)) == 59  # cut to the width: a wrapped row could not be redrawn in place


def test_a_terminal_row_is_cleared_while_pytest_writes_and_when_the_loop_ends(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    shown, reporter, _ = board(tty=True)
    shown.update("gw0", snapshot())
    with shown.terminal_turn():
        before = reporter.out.getvalue()
        reporter.write(".")
    assert before.endswith(SAVE + "\x1bD" + CLEAR_ROW + RESTORE)  # cleared before the dot
    assert reporter.out.getvalue().endswith(RESTORE) and reporter.out.getvalue().count("[kvbench]") == 2
    shown.update("gw0", snapshot(item=None, items_done=1, items_seconds=5.0))  # nothing busy: cleared
    assert reporter.out.getvalue().endswith(CLEAR_ROW + RESTORE)
    shown.update("gw0", snapshot(done=3))
    shown.close()
    assert reporter.out.getvalue().endswith(CLEAR_ROW + RESTORE)
    shown.update("gw1", snapshot())
    assert reporter.out.getvalue().endswith(CLEAR_ROW + RESTORE)  # nothing after the end


def test_a_worker_that_went_away_keeps_its_finished_items_but_no_longer_runs():
    shown, reporter, clock = board(interval=0)
    shown.update("gw0", snapshot(items_done=3, items_seconds=30.0))
    shown.disconnect("gw0")
    shown.update("gw1", snapshot(items_done=1, items_seconds=10.0))
    # 4 done at 10 s each, 6 left, one worker left running them
    assert reporter.out.getvalue().splitlines()[-1].endswith("items 4/10, session ETA 1m00s")


def test_with_sharing_groups_the_session_eta_is_the_groups_model_not_the_mean():
    """Two groups of five, one per worker: gw0's host passed in 600 s and its later items in no time, gw1's
    host has 10 samples left at 20 s. The mean said 5 items left x 120 s / 2 workers; the groups say 200 s."""
    shown, reporter, _ = board(interval=0)
    shown.model(WorkersEstimate({f"{group}{m}": group for group in "ab" for m in range(5)}))
    shown.item_started("a0")
    shown.item_started("b0")
    shown.item_finished("a0", 600.0)
    for m in range(1, 5):
        shown.item_started(f"a{m}")
        shown.item_finished(f"a{m}", 0.0)
    shown.update("gw0", snapshot(item=None, items_done=5, items_seconds=600.0))
    shown.update("gw1", snapshot(item="b0", done=20, total=30, per_sample=20.0, items_done=0))
    assert reporter.out.getvalue().splitlines()[-1].endswith("items 5/10, session ETA 3m20s")
    shown.model(None)  # no sharing groups (--dist load, sharing off): the mean
    shown.update("gw1", snapshot(item="b0", done=21, total=30, per_sample=20.0, items_done=0))
    assert reporter.out.getvalue().splitlines()[-1].endswith("items 5/10, session ETA 5m00s")


def test_the_interval_comes_from_the_ini_and_bad_values_are_usage_errors(pytester, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pytester.makeini("[pytest]\nkvbench_progress_interval = soon\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert [line for line in result.stderr.lines if line.strip()] == [
        "ERROR: ini key kvbench_progress_interval must be a number of seconds >= 0, got 'soon'"]
    for bad in ("-1", "nan", "inf", ""):
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-o", f"kvbench_progress_interval={bad}")
        assert result.ret == pytest.ExitCode.USAGE_ERROR and f"got {bad!r}" in result.stderr.str(), bad
