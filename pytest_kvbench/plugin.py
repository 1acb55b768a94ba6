"""The pytest11 entry point: wires options, hooks and fixtures of pytest-kvbench together.

Nothing here does benchmark work itself. Configuration resolves and validates the grid
(wiring/options.py), collection turns it into one item per case (wiring/grid.py), the ``kvbench``
fixture runs an item (engine/runner.py), each finished item's record goes through the
``pytest_kvbench_record`` hook (wiring/hookspecs.py) into the run directory (wiring/session.py),
and the controller writes the results at the end (results/tables.py) and gates against a
baseline (wiring/gate.py).
"""

from __future__ import annotations

import functools
import math
import os
from pathlib import Path

import pytest

from pytest_kvbench.results import record as records
from pytest_kvbench.results.environment import capture_environment
from pytest_kvbench.results.run_writer import new_run_id
from pytest_kvbench.wiring import hookspecs, options
from pytest_kvbench.wiring.gate import Gate
from pytest_kvbench.wiring.gpu_slots import DeviceSlots
from pytest_kvbench.wiring.progress import ProgressPlugin, SessionProgress
from pytest_kvbench.wiring.grid import Case, GridError
from pytest_kvbench.wiring.resume import check_resume
from pytest_kvbench.wiring.session import RunSession
from pytest_kvbench.wiring.xdist_groups import reference_group_scheduler, xdist_group_name
from pytest_kvbench.tasks.registry import SUITE_DESCRIPTIONS

SESSION_KEY = pytest.StashKey[RunSession]()
RUNNER_KEY = pytest.StashKey[object]()
GATE_KEY = pytest.StashKey[Gate]()
RECORD_KEY = pytest.StashKey[dict]()
VERDICT_KEY = pytest.StashKey[dict]()
SLOTS_KEY = pytest.StashKey[DeviceSlots]()
PROGRESS_KEY = pytest.StashKey[SessionProgress]()
SUITES = tuple(SUITE_DESCRIPTIONS)  # one marker and one bench/test_<suite>.py per task suite
SLOW_CONTEXT = 8192  # RULER items from this context length on are marked slow

MARKERS = {
    "smoke": "quick subset of the benchmark grid (smallest budget, smoke tasks)",
    **SUITE_DESCRIPTIONS,
    "slow": f"items expected to take long (RULER contexts of {SLOW_CONTEXT} tokens and more)",
}


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    options.add_options(parser)


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    try:
        grid = options.resolve_grid(config)
        gate = Gate.from_config(config)
        results = options.results_dir(config)
        if _is_worker(config):
            run_id = config.workerinput["kvbench_run_id"]
        elif config.getoption("kvbench_resume") is not None:
            run_id = check_resume(config.getoption("kvbench_resume"), results, grid)
        else:
            run_id = new_run_id()
    except GridError as exc:
        raise pytest.UsageError(str(exc)) from None
    if _is_worker(config):
        _pin_worker_device(config)
    else:
        _check_worker_count(config)
    session = RunSession(grid, results, run_id, is_controller=not _is_worker(config),
                         environment=capture_environment(config.invocation_params.args),
                         resumed=config.getoption("kvbench_resume") is not None)
    config.stash[SESSION_KEY] = session
    config.stash[GATE_KEY] = gate
    config.pluginmanager.register(ProgressPlugin(config), "kvbench-progress")
    timeout = _positive_option(config, "kvbench_timeout", float, "a positive number of seconds")
    threads = _positive_option(config, "kvbench_torch_threads", int, "a positive integer")
    cores = os.cpu_count() or 1
    if threads is not None and threads > cores:
        raise pytest.UsageError(f"--kvbench-torch-threads {threads}: more threads than the {cores} CPU cores here")
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    from pytest_kvbench.engine.runner import Runner

    config.stash[RUNNER_KEY] = Runner(grid, run_id, timeout, share_prefill=not config.getoption("kvbench_no_share_prefill"))


def _positive_option(config: pytest.Config, dest: str, kind: type, what: str):
    """A positive int/float option value, None when unset; a usage error otherwise."""
    raw = config.getoption(dest)
    if raw is None:
        return None
    try:
        value = kind(raw)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        option = "--" + dest.replace("_", "-")
        raise pytest.UsageError(f"{option} must be {what}, got {raw!r}")
    return value


def _check_worker_count(config: pytest.Config) -> None:
    """Controller: more workers than GPUs is a usage error unless explicitly allowed."""
    from pytest_kvbench.wiring.gpu_slots import assign_device

    workers = getattr(config.option, "numprocesses", None)
    if not isinstance(workers, int) or workers < 2:
        return
    import torch

    environ = dict(os.environ, PYTEST_XDIST_WORKER_COUNT=str(workers))
    try:
        assign_device(f"gw{workers - 1}", environ, torch.cuda.device_count(),
                      allow_oversubscribe=config.getoption("kvbench_allow_oversubscribe"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[SLOTS_KEY] = DeviceSlots()


def _pin_worker_device(config: pytest.Config) -> None:
    """Worker: take the GPU slot the controller handed out, before anything initialises CUDA.

    torch.cuda.device_count() counts through NVML without starting CUDA.
    """
    import torch

    from pytest_kvbench.wiring.gpu_slots import apply_environment, assign_device

    try:
        changes = assign_device(os.environ.get("PYTEST_XDIST_WORKER"), os.environ, torch.cuda.device_count(),
                                allow_oversubscribe=config.getoption("kvbench_allow_oversubscribe"),
                                slot=config.workerinput.get("kvbench_device_slot"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    apply_environment(changes)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: every worker appends to the same run and gets its own GPU slot."""
    config = node.config
    node.workerinput["kvbench_run_id"] = config.stash[SESSION_KEY].run_id
    node.workerinput["kvbench_dist"] = config.getvalue("dist")  # workers see dist "no"; sharing needs loadgroup
    slots = config.stash.get(SLOTS_KEY, None)
    if slots is not None:
        node.workerinput["kvbench_device_slot"] = slots.acquire(node.gateway.id)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """A worker that died frees its GPU slot for the replacement xdist starts."""
    slots = node.config.stash.get(SLOTS_KEY, None)
    if slots is not None:
        slots.release(node.gateway.id)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: keep the items sharing a full-cache reference on one worker."""
    if config.getvalue("dist") != "loadgroup":
        return None
    grid = config.stash[SESSION_KEY].grid
    groups = {case.id: xdist_group_name(case.reference_group)
              for suite in SUITES for case in grid.cases(suite, _suite_of)}
    return reference_group_scheduler(config, log, groups)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    """xdist controller: the items a worker will run are the items this run must finish."""
    _expect(node.config, ids)


def pytest_collection_finish(session: pytest.Session) -> None:
    if not _is_worker(session.config):
        _expect(session.config, [item.nodeid for item in session.items])
    _plan_items(session)


def _expect(config: pytest.Config, nodeids) -> None:
    run = config.stash.get(SESSION_KEY, None)
    if run is not None and run.is_controller:
        run.expect((case, nodeid) for nodeid in nodeids if (case := _case_of_nodeid(config, nodeid)) is not None)


def _case_of_nodeid(config: pytest.Config, nodeid: str) -> Case | None:
    """The case behind a benchmark item's node id (``file::test[case id]``); None for other tests."""
    if not nodeid.endswith("]") or "[" not in nodeid:
        return None
    run = config.stash[SESSION_KEY]
    if run.cases_by_id is None:
        run.cases_by_id = {case.id: case for suite in SUITES for case in run.grid.cases(suite, _suite_of)}
    return run.cases_by_id.get(nodeid.rsplit("[", 1)[1][:-1])


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report, sched) -> None:
    """xdist controller: a worker died inside an item. Its record says so, and the run is incomplete."""
    config = getattr(sched, "config", None) or report.node.config
    case = _case_of_nodeid(config, crashitem)
    if case is None:
        return
    run = config.stash[SESSION_KEY]
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "?")
    message = (f"worker {worker} crashed while running this item (the process died: killed, out of host "
               f"memory or a hard crash); run it again with --kvbench-resume {run.run_id}")
    record = records.with_outcome(records.identity(case, run.run_id, case.protocol), status="error",
                                  nodeid=crashitem, message=message)
    run.add(record | {"crashed": True})


@functools.cache
def _suite_of(task: str) -> str:
    from pytest_kvbench.tasks import get_task

    return get_task(task).suite


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kvbench_case" not in metafunc.fixturenames:
        return
    suites = [s for s in SUITES if metafunc.definition.get_closest_marker(s)]
    if len(suites) != 1:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: mark the test with exactly one of {', '.join(SUITES)}")
    session = metafunc.config.stash[SESSION_KEY]
    cases = session.grid.cases(suites[0], _suite_of)
    suite_mark = getattr(pytest.mark, suites[0])
    params = []
    for case in cases:
        marks = [suite_mark, pytest.mark.xdist_group(xdist_group_name(case.reference_group))]
        if case.smoke:
            marks.append(pytest.mark.smoke)
        if (case.context_length or 0) >= SLOW_CONTEXT:
            marks.append(pytest.mark.slow)
        params.append(pytest.param(case, id=case.id, marks=marks))
    metafunc.parametrize("kvbench_case", params)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    run = config.stash[SESSION_KEY]
    # A suite with no case in the grid (e.g. only RULER tasks chosen) gets no item at all,
    # rather than pytest's placeholder for an empty parameter set.
    items[:] = [i for i in items if not _empty_case_item(i)]
    keep, drop = list(items), []
    if config.getoption("kvbench_resume"):
        done = run.finished_keys()
        is_done = [_case(i) is not None and _case(i).key in done for i in keep]
        keep, drop = ([i for i, d in zip(keep, is_done) if not d], [i for i, d in zip(keep, is_done) if d])
    shard = config.getoption("kvbench_shard")
    if shard:
        from pytest_kvbench.wiring.shards import parse_shard, select_shard

        try:
            k, n = parse_shard(shard)
        except ValueError as exc:
            raise pytest.UsageError(f"--kvbench-shard: {exc}") from None
        bench = [i for i in keep if _case(i) is not None]
        chosen = {id(i) for i in select_shard(bench, k, n, lambda i: _case(i).model)}
        drop += [i for i in bench if id(i) not in chosen]
        keep = [i for i in keep if _case(i) is None or id(i) in chosen]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _plan_items(session: pytest.Session) -> None:
    """The items this process runs: the progress line counts them, and they share their prefills
    (engine/shared_prefills.py). Under xdist only --dist loadgroup keeps a reference group on one
    worker; other schedules plan no sharing."""
    config = session.config
    progress = config.stash[PROGRESS_KEY] = SessionProgress(config)
    progress.items_total = sum(_case(item) is not None for item in session.items)
    runner = config.stash.get(RUNNER_KEY, None)
    if runner is None or (_is_worker(config) and config.workerinput.get("kvbench_dist") != "loadgroup"):
        return
    runner.shared.plan(case for case in map(_case, session.items) if case is not None)


def _empty_case_item(item: pytest.Item) -> bool:
    return "kvbench_case" in getattr(item, "fixturenames", ()) and _case(item) is None


def _case(item: pytest.Item):
    callspec = getattr(item, "callspec", None)
    case = callspec.params.get("kvbench_case") if callspec else None
    return case if isinstance(case, Case) else None


class KvbenchFixture:
    """What a benchmark test function uses: run its case, then gate the record."""

    def __init__(self, item: pytest.Item) -> None:
        self.item = item
        self.config = item.config

    def run(self, case) -> dict:
        from pytest_kvbench.engine.models import ModelLoadError
        from pytest_kvbench.engine.out_of_memory import ItemOutOfMemory
        from pytest_kvbench.tasks import DataError, TaskError, TaskUnavailable

        runner = self.config.stash[RUNNER_KEY]
        progress = self.config.stash[PROGRESS_KEY].item(case.id)
        try:
            record = runner.run(case, progress)
        except TaskUnavailable as exc:
            pytest.skip(str(exc))
        except (ModelLoadError, TaskError, DataError) as exc:
            # bad input found only now (a model that will not load, data too short): one paragraph,
            # without the chain of exceptions behind it (pytest prints a chain even with pytrace=False)
            raise pytest.fail.Exception(f"{case.id}: {exc}", pytrace=False) from None
        except ItemOutOfMemory as exc:  # the runner already freed the memory the item held
            raise pytest.fail.Exception(str(exc), pytrace=False) from None
        finally:
            progress.finish()
        self.item.stash[RECORD_KEY] = record
        for key in ("score", "metric"):
            self.item.user_properties.append((f"kvbench_{key}", record[key]))
        self.item.user_properties.append(("kvbench_kl", record["fidelity"]["kl"]))
        self.item.user_properties.append(("kvbench_agreement", record["fidelity"]["agreement"]))
        self.item.user_properties.append(("kvbench_total_s", record["latency"]["total_s"]))
        self.item.user_properties.append(("kvbench_peak_bytes", record["memory"]["peak_bytes"]))
        return record

    def check(self, record: dict) -> None:
        """Fail on a significant regression against the baseline (--kvbench-compare).

        The verdict goes into the item's record (once: the controller's summary reads it back)."""
        verdict = self.config.stash[GATE_KEY].judge(record)
        if verdict is None:
            return
        self.item.stash[VERDICT_KEY] = verdict.as_dict()
        if verdict.status in ("regression", "mismatch"):
            pytest.fail(verdict.message, pytrace=False)


@pytest.fixture
def kvbench(request: pytest.FixtureRequest) -> KvbenchFixture:
    return KvbenchFixture(request.node)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    case = _case(item)
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
        measured = records.identity(case, session.run_id, case.protocol)
    record = records.with_outcome(measured, status=status, nodeid=item.nodeid,
                                  message=None if report.passed else _one_line(report),
                                  verdict=item.stash.get(VERDICT_KEY, None))
    item.config.hook.pytest_kvbench_record(record=record, item=item)


def _one_line(report: pytest.TestReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    text = getattr(report.longrepr, "reprcrash", None)
    message = text.message if text is not None else str(report.longrepr)
    return message.strip().splitlines()[0] if message.strip() else report.outcome


@pytest.hookimpl(tryfirst=True)
def pytest_kvbench_record(record: dict, item: pytest.Item) -> None:
    item.config.stash[SESSION_KEY].add(record)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    run = config.stash.get(SESSION_KEY, None)
    if run is None or not run.is_controller or not run.records_path.exists():
        return
    complete = exitstatus not in (pytest.ExitCode.INTERRUPTED,) and not session.shouldstop
    run_json = run.finish(complete=complete)
    config.stash[GATE_KEY].finish(run_json["records"], run_json["environment"])


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    run = config.stash.get(SESSION_KEY, None)
    if run is None or not run.is_controller or not run.records_path.exists():
        return
    from pytest_kvbench.results.tables import budget_tables, zero_scores

    records = run.final_records if run.final_records is not None else run.all_records()
    terminalreporter.section("kvbench")
    for heading, table in budget_tables(records, fmt="simple", bold=False):
        terminalreporter.write_line(heading)
        terminalreporter.write_line(table)
        terminalreporter.write_line("")
    zeros = zero_scores(records)
    if zeros:
        shown = ", ".join(zeros[:8]) + (", ... (list in RESULTS.md)" if len(zeros) > 8 else "")
        terminalreporter.write_line(f"{len(zeros)} item(s) scored exactly 0 (check these): {shown}", yellow=True)
    for line in config.stash[GATE_KEY].summary_lines():
        terminalreporter.write_line(line)
    if run.unfinished:
        shown = ", ".join(u["item_id"] for u in run.unfinished[:8]) + (" ..." if len(run.unfinished) > 8 else "")
        terminalreporter.write_line(f"run {run.run_id} is incomplete: {len(run.unfinished)} item(s) not finished "
                                    f"({shown}); finish them with: {run.resume_command()}", red=True)
    terminalreporter.write_line(f"run {run.run_id}: {run.run_dir} ; table: {Path(run.results_dir) / 'RESULTS.md'}")
