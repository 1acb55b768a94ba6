"""One line per finished benchmark item when stdout is not a terminal (CI logs).

pytest writes a file name and then a dot per item; the plugin's progress lines (live.py) need lines of
their own, so a log used to read as file names, lines of one or two dots and progress lines, alternating.
In a log each benchmark item now gets one line when it ends, in place of its dot:
``[kvbench] snapkv-128-niah_single_1-ctx2048 passed in 0.4 s, score 100.00; items 17/60, session ETA 3m10s``.

How, with pytest's own hooks: ``pytest_report_teststatus`` keeps the item's outcome word and category (the
summary counts and ``-v`` are unchanged) but gives no short letter, so the terminal writes no dot; the
reporter's ``showfspath`` is turned off, as xdist does, so no file names are written; the line itself is
written after the terminal's ``pytest_runtest_logreport``. Other tests in the session keep their dots. On a
terminal, under ``-q`` and in xdist workers nothing changes.
"""

from __future__ import annotations

import pytest

from pytest_kvbench.wiring.items import case_of_nodeid, is_worker
from pytest_kvbench.wiring.progress.live import plain_lines
from pytest_kvbench.wiring.progress.text import PREFIX, session_part, start_own_line
from pytest_kvbench.wiring.stash_keys import PROGRESS_KEY


class FinishedItemLines:
    """Registered by run_plugin.py in every process; active in the process that writes the terminal (single
    process or xdist controller) when its stdout is not a terminal and the run is not quiet."""

    def __init__(self, config: pytest.Config, progress_plugin) -> None:
        self.config = config
        self.progress_plugin = progress_plugin  # its xdist board knows the workers' counts
        self.enabled = False
        self.finished = 0
        self.session: pytest.Session | None = None

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self.session = session
        self.enabled = not is_worker(self.config) and plain_lines(self.config)
        if self.enabled:
            self.config.pluginmanager.get_plugin("terminalreporter").showfspath = False

    def _is_final_case_report(self, report: pytest.TestReport) -> bool:
        final = report.when == "call" or (report.when == "setup" and not report.passed)
        return self.enabled and final and case_of_nodeid(self.config, report.nodeid) is not None

    @pytest.hookimpl(wrapper=True)
    def pytest_report_teststatus(self, report, config):
        status = yield
        if not isinstance(report, pytest.TestReport) or not self._is_final_case_report(report):
            return status
        category, letter, word = status
        return category, "", word or category or report.outcome  # a word, so pytest still counts the item

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self._is_final_case_report(report):
            return
        self.finished += 1
        item_id = report.nodeid.rsplit("[", 1)[1][:-1]
        outcome = "error" if report.when == "setup" and report.failed else report.outcome
        score = dict(report.user_properties).get("kvbench_score")
        line = f"{PREFIX} {item_id} {outcome} in {report.duration:.1f} s"
        if isinstance(score, (int, float)):
            line += f", score {score:.2f}"
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        start_own_line(reporter)
        reporter.write_line(f"{line}; {self._session_part()}")

    def _session_part(self) -> str:
        progress = self.config.stash.get(PROGRESS_KEY, None)
        if progress is not None and progress.items_total:
            return progress.session_part()
        board = self.progress_plugin.board
        if board is not None and board.snapshots:
            return board.session_part()
        return session_part(self.finished, self.session.testscollected if self.session else self.finished, None)
