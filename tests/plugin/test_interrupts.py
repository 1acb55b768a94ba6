"""Ctrl-C at every point of a real run, and two processes on one run directory.

Each run is a real ``pytest`` subprocess in its own session (process group); a conftest sends SIGINT to the
whole group, as a terminal's Ctrl-C does, at a point chosen by ``KVBENCH_TEST_SIGINT`` and reached through
pytest's hooks (or, inside an item, torch's global forward hook), so no test waits on a clock. Whatever the
point, run.json and RESULTS.md must agree with records.jsonl: a run whose items all finished is complete,
an interrupted one names its missing items and the command that finishes it, and pytest ends with its usual
short note (exit 2), never a traceback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import BENCH, HOOK_CONFTEST

from pytest_kvbench.results.run import storage
from pytest_kvbench.results.run.lock import LOCK_FILE, RunLock

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

FIRST, SECOND = "full-passage_retrieval_en", "streamingllm-32-passage_retrieval_en"
GRID = ["--kvbench-methods", "full,streamingllm", "--kvbench-budgets", "32", "--kvbench-tasks", "passage_retrieval_en",
        "--kvbench-samples", "1", "--kvbench-max-prompt-tokens", "200", "--kvbench-torch-threads", "1"]

SIGINT_CONFTEST = HOOK_CONFTEST + '''
import os, signal
import pytest

POINT = os.environ.get("KVBENCH_TEST_SIGINT", "")
TARGET = os.environ.get("KVBENCH_TEST_ITEM", "")
running = []

def ctrl_c():
    os.killpg(os.getpgid(0), signal.SIGINT)  # the whole process group, as a terminal's Ctrl-C

@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session):
    if POINT == "before-first-item":
        ctrl_c()

@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    running.append(item.nodeid)
    if POINT == "sigterm-in-item" and item.nodeid.endswith(f"[{TARGET}]"):  # SIGTERM to the controller alone
        os.kill(os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid(), signal.SIGTERM)
    if POINT == "hold" and item.nodeid.endswith(f"[{TARGET}]"):  # hold the run lock until the test says
        with open(os.environ["KVBENCH_TEST_READY"], "w") as ready:
            ready.write(str(os.getpid()))
        open(os.environ["KVBENCH_TEST_RELEASE"]).read()
    try:
        return (yield)
    finally:
        running.pop()

def pytest_runtest_logfinish(nodeid):
    if POINT == "between-items" and nodeid.endswith(f"[{TARGET}]"):
        ctrl_c()

def pytest_configure(config):
    if POINT == "in-item":  # inside the target item's model forward: deep in torch and the engine
        import torch

        def forward_pre_hook(module, args):
            if running and running[-1].endswith(f"[{TARGET}]"):
                ctrl_c()
        torch.nn.modules.module.register_module_forward_pre_hook(forward_pre_hook)
    if POINT == "xdist-teardown":  # all items finished; the controller is stopping its workers
        from xdist.workermanage import NodeManager
        teardown = NodeManager.teardown_nodes
        def teardown_nodes(self):
            os.kill(os.getpid(), signal.SIGINT)  # the controller's, where pytest's traceback came from
            return teardown(self)
        NodeManager.teardown_nodes = teardown_nodes
    if POINT == "writing":  # the controller writes the item folders, run.json and RESULTS.md
        from pytest_kvbench.results.run import writer as run_writer
        write_item_files = run_writer.write_item_files
        fired = []
        def first_write(*args):  # once: the end of a run may hold this function (functools.partial) per item
            if not fired:
                fired.append(True)
                ctrl_c()
            return write_item_files(*args)
        run_writer.write_item_files = first_write
'''


def start_bench(work: Path, *args: str, env: dict | None = None, sigint_ignored: bool = False) -> subprocess.Popen:
    """The benchmark in a fresh interpreter and its own process group; ``sigint_ignored``: as a background job
    of a shell script starts it (SIGINT inherited ignored)."""
    work.mkdir(parents=True, exist_ok=True)
    for name in ("test_longbench.py", "test_ruler.py"):
        (work / name).write_text((BENCH / name).read_text())
    (work / "conftest.py").write_text(SIGINT_CONFTEST)
    environ = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONHASHSEED="0", **(env or {}))
    ignore = (lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if sigint_ignored else None
    return subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *GRID, *args], cwd=work,
                            env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=ignore)


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_bench(work: Path, *args: str, **options) -> subprocess.CompletedProcess:
    return finish(start_bench(work, *args, **options))


def interrupted_run(tmp_path_factory, point: str, *args: str, item: str = "", **options):
    """(process, results dir, run id, run.json, records.jsonl records) of a run sent Ctrl-C at ``point``."""
    base = tmp_path_factory.mktemp(point)
    results = base / "res"
    proc = run_bench(base / "work", "--kvbench-results", str(results), *args,
                     env={"KVBENCH_TEST_SIGINT": point, "KVBENCH_TEST_ITEM": item}, **options)
    runs = sorted((results / "runs").iterdir()) if (results / "runs").is_dir() else []
    assert len(runs) == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = json.loads((runs[0] / storage.RUN_FILE).read_text())
    return proc, results, runs[0].name, run, storage.read_records(runs[0] / storage.RECORDS_FILE)


def assert_short_interrupt_note(proc) -> None:
    """pytest's usual ending of an interrupted session: exit 2, its one KeyboardInterrupt note, no traceback.

    Not counted: the warnings summary, where xdist relays its workers' warnings. A worker whose Ctrl-C lands
    inside a finalizer (``__del__``) gets Python's "Exception ignored" warning, with a traceback, from Python."""
    output = proc.stdout.split("warnings summary")[0] + proc.stderr
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output[-3000:]
    assert "Traceback" not in output and "INTERNALERROR" not in output, output[-4000:]
    assert "KeyboardInterrupt" in proc.stdout and "(to show a full traceback on KeyboardInterrupt" in proc.stdout


def assert_incomplete(results: Path, run_id: str, run: dict, records: list[dict], missing: list[str]) -> None:
    """run.json and RESULTS.md agree with records.jsonl and name each missing item and the resume command."""
    assert run["complete"] is False
    assert sorted(r["item_id"] for r in run["records"]) == sorted(r["item_id"] for r in records)
    assert sorted(u["item_id"] for u in run["unfinished"]) == sorted(missing)
    assert not any(r.get("crashed") for r in records), "an interrupted item is missing, not crashed"
    assert f"--kvbench-resume {run_id}" in run["resume_command"]
    markdown = (results / "runs" / run_id / "RESULTS.md").read_text()
    assert "## Items not finished" in markdown and all(f"`{item}`" in markdown for item in missing)
    assert f"--kvbench-resume {run_id}" in markdown


def test_ctrl_c_before_the_first_item_leaves_a_run_naming_every_item(tmp_path_factory):
    proc, results, run_id, run, records = interrupted_run(tmp_path_factory, "before-first-item")
    assert_short_interrupt_note(proc)
    assert records == []
    assert_incomplete(results, run_id, run, records, [FIRST, SECOND])
    assert (results / "runs" / run_id / storage.SETTINGS_FILE).is_file(), "what --kvbench-resume checks against"


def test_ctrl_c_between_items_keeps_the_first_and_names_the_second(tmp_path_factory):
    proc, results, run_id, run, records = interrupted_run(tmp_path_factory, "between-items", item=FIRST)
    assert_short_interrupt_note(proc)
    assert [(r["item_id"], r["status"]) for r in records] == [(FIRST, "passed")]
    assert_incomplete(results, run_id, run, records, [SECOND])


@pytest.fixture(scope="module")
def stopped_inside_an_item(tmp_path_factory):
    """Ctrl-C inside the second item's model forward, of a run started with SIGINT ignored (``pytest ... &`` in a
    script): the run must still stop there, with the first item recorded and the second missing. (Without
    prefill sharing: shared, the first item would decode the second's sample too.)"""
    return interrupted_run(tmp_path_factory, "in-item", "--kvbench-no-share-prefill", item=SECOND, sigint_ignored=True)


def test_ctrl_c_inside_an_item_stops_it_even_when_sigint_was_inherited_ignored(stopped_inside_an_item):
    proc, results, run_id, run, records = stopped_inside_an_item
    assert_short_interrupt_note(proc)
    assert [(r["item_id"], r["status"]) for r in records] == [(FIRST, "passed")]
    assert_incomplete(results, run_id, run, records, [SECOND])
    assert "1 passed" in proc.stdout and f"run {run_id} is incomplete: 1 item(s) not finished ({SECOND})" in proc.stdout


def test_ctrl_c_inside_an_xdist_worker_item_is_no_crash(tmp_path_factory):
    proc, results, run_id, run, records = interrupted_run(tmp_path_factory, "in-item", "-n", "2", item=SECOND)
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout.split("warnings summary")[0] + proc.stderr
    assert SECOND not in [r["item_id"] for r in records]
    assert_incomplete(results, run_id, run, records, [u["item_id"] for u in run["unfinished"]])
    assert SECOND in [u["item_id"] for u in run["unfinished"]]


def test_sigterm_to_an_xdist_controller_stops_it_as_ctrl_c_and_its_workers_quietly(tmp_path_factory):
    """Killed outright, the controller left its workers running to the end of their items, each then printing
    PluggyTeardownRaisedWarning ("cannot send"), and no run.json. The output is read to its end, which comes when
    the last worker holding the pipes exits."""
    proc, results, run_id, run, records = interrupted_run(tmp_path_factory, "sigterm-in-item", "-n", "2", item=SECOND)
    assert_short_interrupt_note(proc)
    assert "PluggyTeardownRaisedWarning" not in proc.stdout + proc.stderr, proc.stderr[-3000:]
    # whether the second item's record reached the controller before it stopped is a race; the files agree either way
    assert sorted(r["item_id"] for r in run["records"]) == sorted(r["item_id"] for r in records)
    assert run["complete"] is False or FIRST in [r["item_id"] for r in records]


@pytest.mark.parametrize("point, xdist", [("xdist-teardown", ["-n", "2"]), ("writing", [])])
def test_ctrl_c_after_every_item_finished_still_writes_a_complete_run(tmp_path_factory, point, xdist):
    proc, results, run_id, run, records = interrupted_run(tmp_path_factory, point, *xdist)
    assert_short_interrupt_note(proc)
    assert run["complete"] is True and run["unfinished"] == [] and run["resume_command"] is None
    assert sorted((r["item_id"], r["status"]) for r in run["records"]) == [(FIRST, "passed"), (SECOND, "passed")]
    assert sorted(r["item_id"] for r in records) == [FIRST, SECOND]
    assert (results / "RESULTS.md").read_text() == (results / "runs" / run_id / "RESULTS.md").read_text()
    assert "Items not finished" not in (results / "RESULTS.md").read_text()
    assert "2 passed" in proc.stdout


def test_a_run_is_locked_while_resumed_and_released_on_any_exit(stopped_inside_an_item, tmp_path):
    _, results, run_id, _, before = stopped_inside_an_item
    run_dir = results / "runs" / run_id
    ready, release = tmp_path / "ready", tmp_path / "release"
    os.mkfifo(ready)
    os.mkfifo(release)
    holder = start_bench(tmp_path / "a", "--kvbench-results", str(results), "--kvbench-resume", run_id,
                         env={"KVBENCH_TEST_SIGINT": "hold", "KVBENCH_TEST_ITEM": SECOND,
                              "KVBENCH_TEST_READY": str(ready), "KVBENCH_TEST_RELEASE": str(release)})
    def unblock_if_it_dies_first():
        holder.wait()
        with open(ready, "w"):
            pass

    threading.Thread(target=unblock_if_it_dies_first, daemon=True).start()
    try:
        pid = ready.read_text()  # blocks until the holder runs its item, lock held
        assert pid, "the resume ended before its item ran"
        second = run_bench(tmp_path / "b", "--kvbench-results", str(results), "--kvbench-resume", run_id)
        assert second.returncode == pytest.ExitCode.USAGE_ERROR, second.stdout[-2000:] + second.stderr[-2000:]
        lines = [line for line in second.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and f"run {run_id} is in use by process {pid} on " in lines[0], lines
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # a holder that dies without a word releases the lock too
        finish(holder)
    assert storage.read_records(run_dir / storage.RECORDS_FILE) == before
    RunLock(run_dir).acquire().release()
    resumed = run_bench(tmp_path / "c", "--kvbench-results", str(results), "--kvbench-resume", run_id)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-2000:]
    lines = storage.read_records(run_dir / storage.RECORDS_FILE)
    assert [(r["item_id"], r["status"]) for r in lines] == [(FIRST, "passed"), (SECOND, "passed")]
    run = json.loads((run_dir / storage.RUN_FILE).read_text())
    assert run["complete"] is True and run["resumed"] is True
    assert (run_dir / LOCK_FILE).exists()
    RunLock(run_dir).acquire().release()  # released at the end of a normal run
