"""The benchmark's plugin, registered by plugin.py once kvbench is used: wires the grid, hooks and fixtures
of pytest-kvbench together.

Nothing here does benchmark work itself. Configuration resolves and validates the grid
(wiring/grid/options.py), collection turns it into one item per case (cases.py), the ``kvbench``
fixture (wiring/fixture.py) runs an item (engine/runner.py), each finished item's record goes
through the ``pytest_kvbench_record`` hook (hookspecs.py) into the run directory
(wiring/session.py), and the controller writes the results at the end (results/views/tables.py), gates
against a baseline (wiring/gate.py) and prints its summary (wiring/terminal_summary.py). xdist's
hooks are in wiring/distributed/xdist_hooks.py.
"""

from __future__ import annotations

import math
import os

import pytest

from pytest_kvbench.cases import GridError
from pytest_kvbench.input_values import MAX_TOKENS, ascii_float, ascii_int, parse_shard, shown
from pytest_kvbench.results import record as records
from pytest_kvbench.results.run.storage import new_run_id
from pytest_kvbench.tasks.registry import SUITE_DESCRIPTIONS, SUITES, suite_of
from pytest_kvbench.wiring import default_selection, fixture
from pytest_kvbench.wiring.grid import command_line, decode_batch_option, options, tracker_options
from pytest_kvbench.wiring.distributed import xdist_hooks
from pytest_kvbench.wiring.gate import Gate
from pytest_kvbench.wiring.interrupts import InterruptShield, honour_sigint
from pytest_kvbench.wiring.item_ids import item_id
from pytest_kvbench.wiring.items import case_of, expect, is_empty_case_item, is_worker, lock_run
from pytest_kvbench.wiring.grid.output_paths import check_run_outputs
from pytest_kvbench.wiring.progress.live import ProgressPlugin, SessionProgress
from pytest_kvbench.wiring.progress.lines import FinishedItemLines
from pytest_kvbench.wiring.runner_settings import RunnerSettings, worker_threads
from pytest_kvbench.wiring.session import RunSession
from pytest_kvbench.wiring.stash_keys import (ACTIVATED_LATE_KEY, GATE_KEY, PLANNED_CASES_KEY, PROGRESS_KEY, RECORD_KEY,
                                              RUNNER_SETTINGS_KEY, SESSION_KEY, SHARING_GROUPS_KEY, SHIELD_KEY, VERDICT_KEY)
from pytest_kvbench.wiring.distributed.shards import select_shard
from pytest_kvbench.wiring.terminal_summary import write_summary
from pytest_kvbench.wiring.grid.transformers_range import check_transformers, kvbench_options_given
from pytest_kvbench.wiring.distributed.group_parts import sharing_groups
from pytest_kvbench.wiring.distributed.xdist_groups import xdist_group_name
from pytest_kvbench.wiring.distributed.xdist_hooks import check_worker_count, pin_worker_device

SLOW_CONTEXT = 8192  # RULER items from this context length on are marked slow

MARKERS = {
    "smoke": "quick subset of the benchmark grid (smallest budget, smoke tasks)",
    **SUITE_DESCRIPTIONS,
    "slow": f"items expected to take long (RULER contexts of {SLOW_CONTEXT} tokens and more)",
}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # The kvbench fixture and xdist's hooks live in their own modules. They are registered as module
    # objects (not `pytest_plugins` names), because this module has imported them already and pytest
    # would warn that it cannot rewrite their assertions.
    config.pluginmanager.register(fixture, "kvbench-fixture")
    config.pluginmanager.register(xdist_hooks, "kvbench-xdist")
    config.pluginmanager.register(default_selection, "kvbench-default-selection")
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    if kvbench_options_given(config):
        check_transformers(config)
    try:
        command_line.check_given_options(config)
        grid = options.resolve_grid(config)
        gate = Gate.from_config(config)
        results = options.results_dir(config)
        if is_worker(config):
            run_id = config.workerinput["kvbench_run_id"]
        elif config.getoption("kvbench_resume") is not None:
            from pytest_kvbench.wiring.grid.resume import check_resume  # lazy for startup time: reads past runs

            run_id = check_resume(config.getoption("kvbench_resume"), results, grid)
        else:
            run_id = new_run_id()
        if not is_worker(config):
            check_run_outputs(results, run_id)
        decode_batch = decode_batch_option.decode_batch(config)
    except GridError as exc:
        raise pytest.UsageError(str(exc)) from None
    if is_worker(config):
        pin_worker_device(config)
    else:
        check_worker_count(config)
    session = RunSession(grid, results, run_id, is_controller=not is_worker(config),
                         invocation_args=config.invocation_params.args,
                         resumed=config.getoption("kvbench_resume") is not None,
                         environment_fields=lambda environment: config.hook.pytest_kvbench_environment(
                             environment=environment, config=config),
                         results_columns=None if is_worker(config) else _results_columns(config))
    config.stash[SESSION_KEY] = session
    config.stash[SHIELD_KEY] = InterruptShield()
    config.stash[GATE_KEY] = gate
    progress_plugin = ProgressPlugin(config)
    config.pluginmanager.register(progress_plugin, "kvbench-progress")
    config.pluginmanager.register(FinishedItemLines(config, progress_plugin), "kvbench-progress-lines")
    timeout = _positive_option(config, "kvbench_timeout", float, "a positive number of seconds")
    threads = _positive_option(config, "kvbench_torch_threads", int, "a positive integer")
    cores = os.cpu_count() or 1
    if threads is not None and threads > cores:
        raise pytest.UsageError(f"--kvbench-torch-threads {threads}: more threads than the {cores} CPU cores here")
    workers = config.workerinput["workercount"] if is_worker(config) else None
    config.stash[RUNNER_SETTINGS_KEY] = RunnerSettings(grid, run_id, timeout, worker_threads(threads, workers),
                                                        share_prefill=not config.getoption("kvbench_no_share_prefill"),
                                                        decode_batch=decode_batch)
    if session.is_controller and tracker_options.requested(config):
        from pytest_kvbench.wiring.trackers.tracking import register  # lazy: MLflow / W&B, for a run asking for one

        register(config)
    if session.resumed and session.is_controller:
        lock_run(config, f"--kvbench-resume {run_id}: ")  # a second resume of the same run is refused here
        from pytest_kvbench.wiring.grid.resume import repair_before_running  # lazy for startup time: resumes only

        repair_before_running(session.run_dir)


def replay_session_start(config: pytest.Config, session: pytest.Session) -> None:
    """Registered during collection (plugin.py): the session start this plugin's parts missed."""
    config.stash[ACTIVATED_LATE_KEY] = True
    config.pluginmanager.get_plugin("kvbench-progress-lines").pytest_sessionstart(session)


def _positive_option(config: pytest.Config, dest: str, kind: type, what: str):
    """A positive int/float option value, None when unset; a usage error otherwise."""
    raw = config.getoption(dest)
    if raw is None:
        return None
    option = "--" + dest.replace("_", "-")
    try:  # ASCII digits only: Python's int() and float() also read '١٢'
        value = ascii_float(raw) if kind is float else ascii_int(raw, option, minimum=1, maximum=MAX_TOKENS)  # threads: cores checked below
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        raise pytest.UsageError(f"{option} must be {what}, got {shown(raw)}")
    return value


def pytest_collection_finish(session: pytest.Session) -> None:
    if not is_worker(session.config):
        expect(session.config, [item.nodeid for item in session.items])
    _plan_items(session)
    if not is_worker(session.config) and session.config.stash[PROGRESS_KEY].items_total:
        session.config.stash[SESSION_KEY].capture_environment()  # as the run starts


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kvbench_case" not in metafunc.fixturenames:
        return
    suites = [s for s in SUITES if metafunc.definition.get_closest_marker(s)]
    if len(suites) != 1:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: mark the test with exactly one of {', '.join(SUITES)}")
    session = metafunc.config.stash[SESSION_KEY]
    cases = session.grid.cases(suites[0], suite_of)
    suite_mark = getattr(pytest.mark, suites[0])
    params = []
    for case in cases:
        marks = [suite_mark, pytest.mark.xdist_group(xdist_group_name(case.reference_group))]
        if case.smoke:
            marks.append(pytest.mark.smoke)
        if (case.context_length or 0) >= SLOW_CONTEXT:
            marks.append(pytest.mark.slow)
        params.append(pytest.param(case, id=item_id(metafunc.config, case), marks=marks))
    metafunc.parametrize("kvbench_case", params)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """After every other plugin's selection (-k, -m, --deselect, conftest hooks): the default selection, then
    --kvbench-shard cuts what would run unsharded (shard K of N of the same selection on every machine, the
    N shards together exactly that selection), then --kvbench-resume drops what the run finished. Cutting
    before the default selection gave one shard nearly nothing; cutting after resume made a resumed shard
    run other shards' items. --lf / --nf (pytest's wrappers) act on what is left after this."""
    run = config.stash[SESSION_KEY]
    if any(case_of(item) is not None for item in items):
        check_transformers(config)
    # A suite with no case in the grid (e.g. only RULER tasks chosen) gets no item at all,
    # rather than pytest's placeholder for an empty parameter set.
    items[:] = [i for i in items if not is_empty_case_item(i)]
    drop = default_selection.left_out_items(config, items)
    dropped = {id(i) for i in drop}
    keep = [i for i in items if id(i) not in dropped]
    shard = config.getoption("kvbench_shard")
    if shard:  # before resume: a resumed shard finishes its own part, not a part of what is left of the grid
        try:
            k, n = parse_shard(shard)
        except ValueError as exc:
            raise pytest.UsageError(str(exc)) from None  # the message names the option
        chosen = {id(i) for i in select_shard(keep, k, n, _shard_group)}
        drop += [i for i in keep if id(i) not in chosen]
        keep = [i for i in keep if id(i) in chosen]
    if config.getoption("kvbench_resume"):
        done = run.finished_keys()
        is_done = [case_of(i) is not None and case_of(i).key in done for i in keep]
        drop += [i for i, d in zip(keep, is_done) if d]
        keep = [i for i, d in zip(keep, is_done) if not d]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _shard_group(item: pytest.Item) -> str:
    """What a shard keeps together: a benchmark case's model; other items (bench/test_kernels.py's timings)
    one group per file, so they run on one shard, not on every one."""
    case = case_of(item)
    return f"model {case.model}" if case is not None else f"file {item.nodeid.split('::', 1)[0]}"


def _shares_prefill(case) -> bool:
    """The method's capability (engine.case_methods.shares_prefill builds it: torch is imported when items run)."""
    from pytest_kvbench.engine.case_methods import shares_prefill  # lazy for startup time: the engine imports torch

    return shares_prefill(case)


def _plan_items(session: pytest.Session) -> None:
    """The items this process runs: the progress line counts them, and they share their prefills
    (engine/sample_outcomes.py, planned when the Runner is built). Under xdist only --dist loadgroup keeps a
    reference group on one worker (or each part of one, with more workers than groups: group_parts.py, the same
    cut as the controller's); other schedules plan no sharing."""
    config = session.config
    progress = config.stash[PROGRESS_KEY] = SessionProgress(config)
    cases = [case for case in map(case_of, session.items) if case is not None]
    if cases and not config.option.collectonly:
        honour_sigint()
    plans_sharing = not is_worker(config) or config.workerinput.get("kvbench_dist") == "loadgroup"
    groups = sharing_groups(cases, config.workerinput["workercount"]) if plans_sharing and is_worker(config) else {}
    settings = config.stash.get(RUNNER_SETTINGS_KEY, None)
    progress.plan(cases, shared=plans_sharing and settings is not None and settings.share_prefill,
                  shares=_shares_prefill, groups=groups)
    if plans_sharing:
        config.stash[PLANNED_CASES_KEY] = cases
        config.stash[SHARING_GROUPS_KEY] = groups


def _results_columns(config: pytest.Config) -> dict:
    """RESULTS.md's columns of the user's own (pytest_kvbench_results_columns), checked at configure: a header the
    tables use already is a usage error (one line, exit 4)."""
    columns: dict = {}
    for answer in config.hook.pytest_kvbench_results_columns(config=config):
        columns.update(answer or {})
    if columns:
        from pytest_kvbench.results.views.tables import OWN_HEADERS  # lazy for startup time: tabulate, only if used

        taken = sorted(set(columns) & OWN_HEADERS)
        if taken:
            raise pytest.UsageError(f"pytest_kvbench_results_columns: {', '.join(map(repr, taken))}: RESULTS.md's "
                                    f"tables have that column already; name yours otherwise")
    return columns


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    case = case_of(item)
    if case is None:
        return
    final = report.when == "call" or (report.when == "setup" and not report.passed)
    if not final:
        return
    measured = item.stash.get(RECORD_KEY, None)
    if report.skipped:
        status = "skipped"
    elif report.passed:
        status = "passed"
    else:
        status = "failed" if measured is not None else "error"
    if measured is None:
        session = item.config.stash[SESSION_KEY]
        measured = records.Record.identity(case, session.run_id, case.protocol)
    record = measured.finished(status=status, nodeid=item.nodeid, item_id=item_id(item.config, case),
                               message=None if report.passed else _one_line(report),
                               verdict=item.stash.get(VERDICT_KEY, None))
    for fields in item.config.hook.pytest_kvbench_record_fields(record=record.to_json(), item=item):
        record = record.with_fields(fields or {})
    item.config.hook.pytest_kvbench_record(record=record.to_json(), item=item)


def _one_line(report: pytest.TestReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    text = getattr(report.longrepr, "reprcrash", None)
    message = text.message if text is not None else str(report.longrepr)
    return message.strip().splitlines()[0] if message.strip() else report.outcome


@pytest.hookimpl(tryfirst=True)
def pytest_kvbench_record(record: dict, item: pytest.Item) -> None:
    refused = item.config.stash[SESSION_KEY].add(record)
    if refused:
        item.session.shouldstop = refused


@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int):
    """Write the run (run.json, RESULTS.md, the gate's baseline) after every other sessionfinish, xdist's
    teardown of its workers included. From here on a first Ctrl-C is held off (wiring/interrupts.py): xdist
    stops its workers and the files are written whole; a second one that breaks the teardown is kept, and the
    run still written."""
    config = session.config
    run, shield = config.stash.get(SESSION_KEY, None), config.stash.get(SHIELD_KEY, None)
    if shield is None or not _writes_run(run, config):  # not a benchmark run: pytest's own handling
        return (yield)
    shield.start(session)
    try:
        yield
    except KeyboardInterrupt:
        shield.note(pytest.ExceptionInfo.from_current())
    # an interrupt in xdist's teardown or while writing came after every item: it does not make the run incomplete
    run_json = run.finish(complete=exitstatus != pytest.ExitCode.INTERRUPTED and not session.shouldstop)
    gate = config.stash[GATE_KEY]
    gate.finish(run.final_records, run_json["environment"])
    if (run.write_failures or gate.write_failures) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # an output asked for is missing (one line: summary)


def _writes_run(run: RunSession | None, config: pytest.Config) -> bool:
    """The controller writes a run directory once a record exists, or when a run with selected items was
    stopped before its first record (run.json then names every item and the resume command)."""
    if run is None or not run.is_controller:
        return False
    return run.records_path.exists() or (bool(run.expected) and not config.option.collectonly)


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """An interrupt held off while the run was written ends the session as interrupted, with pytest's note."""
    shield = config.stash.get(SHIELD_KEY, None)
    interrupted = shield.stop() if shield is not None else None
    if interrupted is None:
        return
    if shield.session is not None and shield.session.exitstatus != pytest.ExitCode.INTERRUPTED:
        shield.session.exitstatus = pytest.ExitCode.INTERRUPTED  # what wrap_session returns
        config.hook.pytest_keyboard_interrupt(excinfo=interrupted)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash.get(SESSION_KEY, None)
    if run is None or not run.is_controller or run.final_records is None:  # no run written (sessionfinish)
        return

    write_summary(terminalreporter, run, config.stash[GATE_KEY])
