"""The trackers' pytest plugin: checked at configure, fed each finished item, ended with the run.

Registered by run_plugin.py on the controller only (an xdist worker never talks to a tracker) when
``--kvbench-mlflow`` / ``--kvbench-wandb`` (or their ini keys) are given. At configure each tracker is checked
(its extra installed, its store answering: a usage error otherwise, before any model loads). Its run starts with
the first finished item: without xdist that item's ``pytest_kvbench_record`` call, under xdist the controller's
report of it, after which the records file holds its record (the worker appended it first). The end comes after
the run's own files are written (a sessionfinish wrapper outside run_plugin's): the status, the files and the
items table. Whatever a tracker raises after configure stops that tracker only, and the summary says so once.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from pytest_kvbench.results.record import Record, RecordError
from pytest_kvbench.results.run import storage
from pytest_kvbench.wiring.grid import tracker_options
from pytest_kvbench.wiring.stash_keys import SESSION_KEY
from pytest_kvbench.wiring.trackers.content import (grid_params, item_metrics, items_table, run_status, run_tags)
from pytest_kvbench.wiring.trackers.errors import TrackerSetupError, one_line

PLUGIN_NAME = "kvbench-trackers"


def _tracker(name: str, target: str):
    if name == "mlflow":
        from pytest_kvbench.wiring.trackers.mlflow_tracker import MlflowTracker  # lazy: asked for by an option

        return MlflowTracker(target)
    from pytest_kvbench.wiring.trackers.wandb_tracker import WandbTracker  # lazy: asked for by an option

    return WandbTracker(target)


class Guarded:
    """One tracker; the first exception it raises after configure stops it and is kept for the summary."""

    def __init__(self, tracker) -> None:
        self.tracker = tracker
        self.where: str | None = None  # what it logged to (its start's answer)
        self.failure: str | None = None

    def call(self, what: str, method: str, *args) -> None:
        if self.failure is not None:
            return
        try:
            answer = getattr(self.tracker, method)(*args)
        except Exception as exc:  # noqa: BLE001 - a tracker is never a reason to lose a benchmark
            self.failure = f"{self.tracker.name} stopped logging at {what}: {one_line(exc)}"
            return
        if method == "start":
            self.where = answer


class RecordsFeed:
    """The records appended to a run's records file since the feed began (the xdist controller's view of the items
    its workers finished), each read once through the typed record."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def new(self) -> list[Record]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        found = []
        for line in data[:end].splitlines():
            try:
                found.append(Record.from_json(json.loads(line)))
            except (ValueError, RecordError):  # a torn line of a killed writer, or damage: no record to log
                continue
        return found


class TrackersPlugin:
    def __init__(self, config: pytest.Config, trackers: list) -> None:
        self.config = config
        self.trackers = [Guarded(t) for t in trackers]
        self.started = False
        self.step = 0
        self.feed: RecordsFeed | None = None
        self.notes: list[str] = []  # what the trackers could not be given (the HTML report), said in the summary

    @property
    def run(self):
        return self.config.stash[SESSION_KEY]

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        run = self.run
        self.step = len(run.all_records()) if run.records_path.exists() else 0  # a resumed run goes on counting
        if self.config.pluginmanager.has_plugin("dsession"):  # xdist's controller: the workers call the hook
            self.feed = RecordsFeed(run.records_path)

    def _start(self) -> None:
        if self.started:
            return
        self.started = True
        run = self.run
        params, tags = grid_params(run.grid.as_dict()), run_tags(run.run_id, run.environment)
        for guarded in self.trackers:
            guarded.call("the start of the run", "start", run.run_id, params, tags)

    def _log(self, record: Record) -> None:
        self._start()
        self.step += 1
        metrics = item_metrics(record, self.run.run_id)
        for guarded in self.trackers:
            guarded.call(f"item {record.item_id or record.key}", "log_item", metrics, self.step)

    def pytest_kvbench_record(self, record: dict, item: pytest.Item) -> None:
        """Without xdist: the item's record, as it finishes (run_plugin.py has appended it to the records file)."""
        if self.feed is None:
            self._log(Record.from_json(record))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Under xdist: a worker's report of an item arrives after its record was appended."""
        if self.feed is not None:
            for record in self.feed.new():
                self._log(record)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int):
        """Outside run_plugin.py's own wrapper: its run.json and RESULTS.md are written when this goes on."""
        try:
            return (yield)
        finally:
            self._finish(session)

    def _finish(self, session: pytest.Session) -> None:
        run = self.run
        if run.final_records is None and not self.started:  # no run written (collect-only, nothing selected)
            return
        if self.feed is not None:
            for record in self.feed.new():
                self._log(record)
        self._start()
        status = run_status(session.exitstatus, run.unfinished, run.write_failures)
        table = items_table(run.final_records or [], run.run_id)
        with tempfile.TemporaryDirectory(prefix="kvbench-report-") as scratch:
            files = [path for path in (run.run_dir / storage.RESULTS_FILE, run.run_dir / storage.RUN_FILE)
                     if path.is_file()] + self._report(run, Path(scratch))
            for guarded in self.trackers:
                guarded.call("the end of the run", "finish", status, files, table)

    def _report(self, run, scratch: Path) -> list[Path]:
        """The run's HTML report (`kvbench report`), for the trackers' artifacts; none if it cannot be made."""
        # lazy for startup time: the report imports numpy, scipy and matplotlib, at the end of a tracked run only
        from pytest_kvbench.results.report.html_report import ReportError, write_report
        from pytest_kvbench.results.run.directories import RunError, load_run

        try:
            return [write_report([load_run(run.run_dir)], scratch / "report.html", title=f"kvbench run {run.run_id}")]
        except (ReportError, RunError, ValueError, OSError) as exc:
            self.notes.append(f"kvbench: the trackers got no HTML report ({one_line(exc)})")
            return []

    def pytest_terminal_summary(self, terminalreporter) -> None:
        for guarded in self.trackers:
            if guarded.where:
                terminalreporter.write_line(f"kvbench: logged to {guarded.where}")
            if guarded.failure:
                terminalreporter.write_line(f"kvbench: {guarded.failure}; the run and its records are complete "
                                            f"without it", yellow=True)
        for note in self.notes:
            terminalreporter.write_line(note, yellow=True)


def register(config: pytest.Config) -> None:
    """Check and register the trackers a run asked for (usage error: one line, before any model loads)."""
    targets = tracker_options.requested(config)
    if not targets:
        return
    trackers = []
    for name, target in targets.items():
        tracker = _tracker(name, target)
        try:
            tracker.check()
        except TrackerSetupError as exc:
            raise pytest.UsageError(str(exc)) from None
        trackers.append(tracker)
    config.pluginmanager.register(TrackersPlugin(config, trackers), PLUGIN_NAME)
