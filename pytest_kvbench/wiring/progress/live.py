"""Live progress of long items on the terminal: which item, samples done, seconds per sample, ETAs.

An item of 200 LongBench samples on an 8B model runs for many minutes behind one dot. While it runs,
the runner reports each finished sample here, and the terminal shows
``[kvbench] snapkv-128-qasper: 12/200 samples, 3.1 s/sample, item ETA 9m43s; items 4/40, session ETA 2h``;
when the item's run decoded its group's members (the group's first item), how they decoded for the sample:
``...item ETA 4m10s; 33 members decoded in one batch; items 1/34, ...``. With batched decoding a group's
first sample decodes every member alone and costs far more than the later, batched ones, so the seconds per
sample and the ETAs are the steady rate from the first batched sample on (progress/eta.py), not the mean.

pytest's conventions: nothing under ``-q``; on a terminal the line is rewritten in place and erased
when the item ends; elsewhere (CI logs) a plain line at each fifth of the item, and one line per finished
item (id, outcome, seconds, score, items done and the session ETA) in place of pytest's file names and dots,
which would otherwise alternate with the progress lines. Output goes around pytest's capture
(capturemanager.global_and_fixture_disabled, as live logging does), so it never lands in a test's captured
output or in --junitxml. The session ETA models reference groups (progress/eta.py): with shared prefill a
group's first item does the work of the whole group.

Under xdist (``-n``) the workers' output goes nowhere, so each worker sends a snapshot after every
sample to the controller, over an execnet channel that the controller opens per worker in
``pytest_configure_node`` and hands over in ``workerinput`` (execnet carries channels inside
messages). The controller shows them (progress/board.py), its session ETA from the sharing groups the
workers run (progress/workers_eta.py, fed here the controller's item reports). No report, event or hook call is made
up: other plugins, the terminal's counts and junitxml see nothing of it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from statistics import fmean
from typing import Any

import pytest

from kvmethods import describe_method
from kvmethods.core.capabilities import prefills_alone
from pytest_kvbench.input_values import ascii_float
from pytest_kvbench.results.record import Record
from pytest_kvbench.wiring.distributed.xdist_groups import parametrize_id
from pytest_kvbench.wiring.items import case_of_nodeid
from pytest_kvbench.wiring.progress.board import WorkersBoard
from pytest_kvbench.wiring.progress.eta import GroupedEstimate, PlannedItem
from pytest_kvbench.wiring.progress.text import PREFIX, batch_note, duration, session_part, start_own_line
from pytest_kvbench.wiring.progress.workers_eta import WorkersEstimate
from pytest_kvbench.wiring.stash_keys import RUNNER_SETTINGS_KEY, SCHEDULED_GROUPS_KEY, SESSION_KEY

CHANNEL_KEY = "kvbench_progress"  # workerinput key of the worker's channel to the controller
INTERVAL_INI = "kvbench_progress_interval"


def _shows_progress(config: pytest.Config) -> bool:
    return config.pluginmanager.get_plugin("terminalreporter") is not None and config.get_verbosity() >= 0


def plain_lines(config: pytest.Config) -> bool:
    """Not a terminal and not quiet: one line per finished item instead of pytest's dots."""
    return _shows_progress(config) and not config.pluginmanager.get_plugin("terminalreporter").isatty()


class SessionProgress:
    """Items done of the session and an ETA from the reference groups' cost model (progress/eta.py).

    In one process it shows the line itself; in an xdist worker that the controller gave a channel
    it sends snapshots instead; otherwise it only keeps count.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.reporter = config.pluginmanager.get_plugin("terminalreporter")
        worker_input = getattr(config, "workerinput", None)
        self.channel = worker_input.get(CHANNEL_KEY) if worker_input is not None else None
        self.enabled = worker_input is None and _shows_progress(config)
        self.items_total = 0
        self.item_seconds: list[float] = []
        self._planned: Callable[[], GroupedEstimate] = lambda: GroupedEstimate([])
        self._estimate: GroupedEstimate | None = None
        self.clock = time.perf_counter
        self.interval = progress_interval(config) if self.enabled else 0.0  # between plain sample lines
        self.last_plain_line = -math.inf

    def plan(self, cases, shared: bool, shares: Callable[[Any], bool] = lambda case: True,
             groups: dict[str, str] | None = None) -> None:
        """The cases this process runs; ``shared``: each reference group (or part of one: ``groups``, by case
        key) shares one prefill per sample, among the cases whose method can (``shares``:
        engine.case_methods.shares_prefill); the others prefill alone. ``shares`` builds methods, so it is asked
        when the first item starts, not at collection."""
        cases = list(cases)
        self.items_total = len(cases)
        groups = groups or {}
        self._planned = lambda: GroupedEstimate([PlannedItem(case.key, groups.get(case.key, case.reference_group)
                                                             if shared and shares(case) else case.key,
                                                             case.samples, case.context_length)
                                                 for case in cases])
        self._estimate = None

    @property
    def estimate(self) -> GroupedEstimate:
        if self._estimate is None:
            self._estimate = self._planned()
        return self._estimate

    def item(self, case, item_id: str | None = None) -> ItemProgress:
        return ItemProgress(self, case, item_id)

    def session_part(self, running: ItemProgress | None = None, done: int = 0, total: int = 0) -> str:
        elapsed = self.clock() - running.started if running is not None else 0.0
        left = self.estimate.remaining(running.key if running is not None else None, done, total, elapsed)
        return session_part(len(self.item_seconds), self.items_total, left)

    def snapshot(self, item_id: str | None, done: int = 0, total: int = 0, per_sample: float = 0.0,
                 batch: str | None = None, elapsed: float = 0.0) -> dict:
        """What a worker tells the controller (progress/board.py and workers_eta.Running read these keys);
        ``elapsed``: the item's seconds so far."""
        return {"item": item_id, "done": done, "total": total, "per_sample": per_sample, "batch": batch,
                "elapsed": elapsed,
                "items_done": len(self.item_seconds), "items_total": self.items_total,
                "items_seconds": sum(self.item_seconds)}

    def send(self, snapshot: dict) -> None:
        try:
            self.channel.send(snapshot)
        except OSError:  # the controller is gone or closed its end: progress never fails an item
            self.channel = None

    def show(self, line: str, *, final: bool = False) -> None:
        capture = self.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture else nullcontext():
            if self.reporter.isatty():
                self.reporter.ensure_newline()
                self.reporter.rewrite("" if final else line, erase=True)
            elif not final:
                start_own_line(self.reporter)
                self.reporter.write_line(line)


class ItemProgress:
    """The runner's per-sample callback for one item: progress(done, total, decoded, samples_decoded), decoded:
    the `decode_batch` of each member the item's run decoded for the sample, samples_decoded: of how many samples
    (more than one: a batch across samples; engine/sample_outcomes.py)."""

    def __init__(self, session: SessionProgress, case, item_id: str | None = None) -> None:
        self.session = session
        self.item_id, self.key = item_id or case.id, case.key  # the pytest id shown (wiring/item_ids.py)
        self.started = self.last_sample = session.clock()
        session.estimate.start(self.key)

    def __call__(self, done: int, total: int, decoded: tuple[int, ...] = (), samples_decoded: int = 0) -> None:
        session = self.session
        now = session.clock()
        session.estimate.sample(self.key, now - self.last_sample, any(size > 1 for size in decoded),
                                covers=max(1, samples_decoded))
        self.last_sample = now
        if not total or not (session.enabled or session.channel):
            return
        elapsed = now - self.started
        projected = session.estimate.projected(self.key, done, total, elapsed)
        # the seconds per sample of the samples left: the steady rate once members decode in batches
        per_sample = (projected - elapsed) / (total - done) if projected is not None and done < total \
            else elapsed / max(done, 1)
        note = batch_note(decoded)
        if session.channel:
            session.send(session.snapshot(self.item_id, done, total, per_sample, note, elapsed))
            return
        if not session.reporter.isatty():  # a log: at each fifth of the item, at most one per interval
            if done not in _checkpoints(total) or now - session.last_plain_line < session.interval:
                return
            session.last_plain_line = now
        session.show(f"{PREFIX} {self.item_id}: {done}/{total} samples, {per_sample:.1f} s/sample, "
                     f"item ETA {duration(per_sample * (total - done))}; " + (f"{note}; " if note else "")
                     + session.session_part(self, done, total))

    def finish(self, record: Record | None = None) -> None:
        """The item ended; its record (None when it raised) says how many samples of how many tokens it ran."""
        session = self.session
        seconds = session.clock() - self.started
        session.item_seconds.append(seconds)
        samples = [s for s in (record.samples if record is not None else []) if s.get("prompt_tokens")]
        session.estimate.finish(self.key, seconds, len(samples),
                                fmean(s["prompt_tokens"] for s in samples) if samples else 0.0)
        if session.channel:
            session.send(session.snapshot(None))
        elif session.enabled and session.reporter.isatty():
            session.show("", final=True)


def _checkpoints(total: int) -> set[int]:
    """The sample counts at which a plain (non-terminal) line is written: every fifth of the item."""
    step = max(1, math.ceil(total / 5))
    return set(range(step, total + 1, step)) | {total}


def progress_interval(config: pytest.Config) -> float:
    """Ini ``kvbench_progress_interval``: least seconds between one worker's plain lines (0: every sample).

    A string key, as the grid's numeric keys are (the ini types int/float need pytest 8.4)."""
    try:
        raw = config.getini(INTERVAL_INI)
    except (TypeError, ValueError) as exc:  # pytest 9's native TOML ini values are typed
        raise pytest.UsageError(f"ini key {INTERVAL_INI}: {exc}") from None
    try:  # ASCII only: float() also reads '١' (input_values.py)
        value = ascii_float(raw) if isinstance(raw, str) else float(raw)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise pytest.UsageError(f"ini key {INTERVAL_INI} must be a number of seconds >= 0, got {raw!r}")
    return value


def sharing_estimate(config: pytest.Config) -> WorkersEstimate | None:
    """Controller: the sharing groups its workers run, for the session ETA (progress/workers_eta.py); None where
    items share no prefill (not --dist loadgroup, --kvbench-no-share-prefill, no benchmark item): the board
    keeps the mean. The groups are the scheduler's cut (group_parts.sharing_groups over the selected items and
    the workers, stashed by xdist_hooks.py when it scheduled); an item whose method prefills alone (the capability, as the workers' plan, without building
    the method where the catalog describes it) costs its own time on its group's worker."""
    settings = config.stash.get(RUNNER_SETTINGS_KEY, None)
    run = config.stash.get(SESSION_KEY, None)
    groups = config.stash.get(SCHEDULED_GROUPS_KEY, None)  # the scheduler's cut (xdist_hooks.py), made once
    if config.getvalue("dist") != "loadgroup" or settings is None or not settings.share_prefill or run is None \
            or not groups:
        return None
    cases = {item: case for item, nodeid in run.expected.values()  # by the items' pytest ids (item_ids.py)
             if (case := case_of_nodeid(config, nodeid)) is not None and item in groups}
    if not cases:
        return None
    alone = {item for item, case in cases.items() if not case.is_reference
             and prefills_alone(describe_method(case.method.name, **case.method.param_dict).capabilities)}
    return WorkersEstimate({item: groups[item] for item in cases}, alone)


class ProgressPlugin:
    """The xdist side of live progress, registered by run_plugin.py in every process.

    Controller: opens a channel per worker and shows what arrives; keeps the progress line out of
    the way of the dots (the wrapped hooks). Worker: closes its channel when the session ends.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.interval = progress_interval(config)  # checked in every process: bad input is a usage error
        self.board = None  # the controller's, made for its first worker
        self.planned = False  # the board was given its sharing groups (at the first item's start)
        self.seconds: dict[str, float] = {}  # running items' seconds of the phases reported so far

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node) -> None:
        if not _shows_progress(self.config):
            return
        if self.board is None:
            self.board = WorkersBoard(self.config.pluginmanager.get_plugin("terminalreporter"), self.interval)
        worker, board = node.gateway.id, self.board
        channel = node.gateway.newchannel()

        def receive(snapshot) -> None:  # in execnet's receiver thread
            if snapshot is None:
                board.disconnect(worker)
            else:
                board.update(worker, snapshot)

        channel.setcallback(receive, endmarker=None)
        board.connect(worker)
        node.workerinput[CHANNEL_KEY] = channel

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logstart(self, nodeid: str):
        if self.board is not None:
            if not self.planned:  # the workers' collections are in (xdist_hooks.py: RunSession.expected)
                self.planned = True
                self.board.model(sharing_estimate(self.config))
            item = parametrize_id(nodeid)
            if item is not None:
                self.board.item_started(item)
        with self._terminal_turn():
            return (yield)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport):
        if self.board is not None:  # before the terminal's and the finished-item line's (lines.py) hooks
            self._count(report)
        with self._terminal_turn():
            return (yield)

    def _count(self, report: pytest.TestReport) -> None:
        """An item ends at its call report (or a setup that did not pass); its seconds are its phases'."""
        item = parametrize_id(report.nodeid)
        if item is None:
            return
        if report.when == "teardown":
            self.seconds.pop(report.nodeid, None)
            return
        seconds = self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        if report.when == "call" or not report.passed:
            self.board.item_finished(item, seconds)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logfinish(self):
        with self._terminal_turn():
            return (yield)

    @pytest.hookimpl(wrapper=True, optionalhook=True)
    def pytest_testnodedown(self):
        with self._terminal_turn():
            return (yield)

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtestloop(self):
        """Innermost: the line is gone before the terminal writes its last progress and summary."""
        try:
            return (yield)
        finally:
            if self.board is not None:
                self.board.close()

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        channel = getattr(session.config, "workerinput", {}).get(CHANNEL_KEY)
        if channel is not None:
            channel.close()

    def _terminal_turn(self):
        return self.board.terminal_turn() if self.board is not None else nullcontext()
