"""The fault matrix: a run killed or interrupted at each point reads the same in every ``kvbench`` command.

Each fault is a real ``pytest`` subprocess in its own process group on the embedded model (one sample, two
items: ``full`` and ``streamingllm`` of one task). A conftest blocks a chosen item on a FIFO once it has
started (``KVBENCH_TEST_BLOCK``), after writing the blocked process's pid to another FIFO, so the test knows
where the run stands without a clock; it then sends the fault (SIGKILL to the whole run, SIGKILL to one xdist
worker, SIGINT to the group as a terminal's Ctrl-C) or releases the item. For every run the state that
``kvbench show`` (its heading), ``list --json``, ``export --format json``, ``compare`` and ``merge`` report is
one and the same (results/run/state.py), and it names the items that did not finish.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import BENCH

from pytest_kvbench import cli
from pytest_kvbench.results.run import storage
from pytest_kvbench.results.run.lock import RunLock

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

FIRST, SECOND = "full-passage_retrieval_en", "streamingllm-32-passage_retrieval_en"
GRID = ["--kvbench-methods", "full,streamingllm", "--kvbench-budgets", "32", "--kvbench-tasks", "passage_retrieval_en",
        "--kvbench-samples", "1", "--kvbench-max-prompt-tokens", "200", "--kvbench-torch-threads", "1"]

BLOCK_CONFTEST = '''
import os
import pytest

@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    target = os.environ.get("KVBENCH_TEST_BLOCK", "")
    marker = os.environ.get("KVBENCH_TEST_READY", "") + ".blocked"
    if target and item.nodeid.endswith(f"[{target}]") and not os.path.exists(marker):
        open(marker, "w").close()  # once: a re-run of the item (xdist reschedules a crashed one) goes on
        with open(os.environ["KVBENCH_TEST_READY"], "w") as ready:
            ready.write(str(os.getpid()))
        open(os.environ["KVBENCH_TEST_RELEASE"]).read()
    return (yield)
'''


class Bench:
    """One benchmark process (group) whose ``block`` item waits until the test releases or kills it."""

    def __init__(self, work: Path, results: Path, *args: str, block: str = "") -> None:
        work.mkdir(parents=True, exist_ok=True)
        for name in ("test_longbench.py", "test_ruler.py"):
            (work / name).write_text((BENCH / name).read_text())
        (work / "conftest.py").write_text(BLOCK_CONFTEST)
        self.ready, self.release = work / "ready", work / "release"
        for fifo in (self.ready, self.release):
            if not fifo.exists():
                os.mkfifo(fifo)
        # --kvbench-results=DIR, one token: pytest takes a separate existing path argument into its rootdir, and the
        # controller creates DIR, so an xdist worker started after it saw the parent as rootdir ('Different tests
        # were collected between gw0 and gw1': work/test_longbench.py against test_longbench.py)
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONHASHSEED="0", KVBENCH_TEST_BLOCK=block,
                   KVBENCH_TEST_READY=str(self.ready), KVBENCH_TEST_RELEASE=str(self.release))
        self.proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *GRID,
                                      f"--kvbench-results={results}", *args], cwd=work, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)
        self.out = self.err = ""

    def blocked_pid(self) -> int:
        """Wait until the blocked item has started; the pid of the process running it (0: the run ended first)."""
        def unblock_if_it_ends_first():
            self.proc.wait()
            with open(self.ready, "w"):
                pass

        threading.Thread(target=unblock_if_it_ends_first, daemon=True).start()
        pid = self.ready.read_text()
        assert pid, self.finish().stdout[-3000:]
        return int(pid)

    def go_on(self) -> None:
        with open(self.release, "w"):
            pass

    def signal_group(self, sig: int) -> None:
        os.killpg(self.proc.pid, sig)

    def finish(self) -> subprocess.CompletedProcess:
        if self.proc.returncode is None or not self.out:
            self.out, self.err = self.proc.communicate(timeout=600)
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, self.out, self.err)


def only_run(results: Path) -> str:
    runs = sorted(p.name for p in (results / "runs").iterdir())
    assert len(runs) == 1, runs
    return runs[0]


def kvbench(capsys, results: Path, *argv) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main([*map(str, argv), "--results", str(results)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def states(capsys, results: Path, run_id: str) -> dict[str, str]:
    """The state of one run as each read command reports it."""
    seen = {}
    code, out, err = kvbench(capsys, results, "show", run_id)
    assert code == 0, err
    heading = out.splitlines()[0]
    assert heading.startswith(f"run {run_id} (") and heading.endswith(")"), heading
    seen["show"] = heading[len(f"run {run_id} ("):-1]
    code, out, err = kvbench(capsys, results, "list", "--json")
    assert code == 0, err
    seen["list"] = next(r["state"] for r in json.loads(out) if r["run_id"] == run_id)
    code, out, err = kvbench(capsys, results, "export", run_id, "--format", "json")
    assert code == 0, err
    seen["export"] = json.loads(out)["state"]
    code, out, err = kvbench(capsys, results, "compare", run_id, run_id)
    assert code in (0, 1) or "has no scored items" in err, err  # the state comes first, whatever follows
    line = next(line for line in out.splitlines() if line.startswith(f"run {run_id} is "))
    seen["compare"] = line[len(f"run {run_id} is "):]
    return seen


def assert_one_state(capsys, results: Path, run_id: str) -> str:
    seen = states(capsys, results, run_id)
    assert len(set(seen.values())) == 1, seen
    return seen["show"]


def run_json(results: Path, run_id: str) -> dict:
    return json.loads((results / "runs" / run_id / storage.RUN_FILE).read_text())


def records(results: Path, run_id: str) -> list[dict]:
    return storage.read_records(results / "runs" / run_id / storage.RECORDS_FILE)


# -- the faults ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def killed_in_second_item(tmp_path_factory):
    """kill -9 of a serial run inside its second item: (results, run id)."""
    base = tmp_path_factory.mktemp("kill9")
    (base / "work").mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(base / "work")]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "the checkout a run is made in"], check=True)
    bench = Bench(base / "work", base / "res", block=SECOND)
    bench.blocked_pid()
    bench.signal_group(signal.SIGKILL)
    assert bench.finish().returncode == -signal.SIGKILL
    return base / "res", only_run(base / "res")


@pytest.fixture(scope="module")
def killed_before_any_record(tmp_path_factory):
    base = tmp_path_factory.mktemp("kill9first")
    bench = Bench(base / "work", base / "res", block=FIRST)
    bench.blocked_pid()
    bench.signal_group(signal.SIGKILL)
    bench.finish()
    return base / "res", only_run(base / "res")


def test_kill_9_inside_an_item_names_the_item_and_keeps_the_provenance(capsys, killed_in_second_item):
    results, run_id = killed_in_second_item
    assert [(r["item_id"], r["status"]) for r in records(results, run_id)] == [(FIRST, "passed")]
    state = assert_one_state(capsys, results, run_id)
    assert state.startswith("incomplete: stopped before its end") and f"1 item(s) not finished ({SECOND})" in state
    _, out, _ = kvbench(capsys, results, "show", run_id)
    commit = subprocess.run(["git", "-C", str(results.parent / "work"), "rev-parse", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    assert f"commit: {commit}" in out and "command: pytest " in out  # written when the run started
    assert f"not finished: {SECOND}" in out and f"--kvbench-resume {run_id}" in out
    environment = run_json(results, run_id)["environment"]
    assert environment["command"].startswith("pytest ") and environment["versions"]["torch"]


def test_a_resume_of_a_damaged_run_says_what_it_repaired_before_running(capsys, tmp_path, killed_in_second_item):
    killed_results, run_id = killed_in_second_item
    results = tmp_path / "res"
    shutil.copytree(killed_results, results)
    run_dir = results / "runs" / run_id
    with open(run_dir / storage.RECORDS_FILE, "a") as log:
        log.write("garbage\n")
    (run_dir / storage.RUN_FILE).write_text((run_dir / storage.RUN_FILE).read_text()[:100])
    code, _, err = kvbench(capsys, results, "show", run_id)
    assert code == 2 and "is damaged (" in err
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *GRID, "--kvbench-results",
                           str(results), "--kvbench-resume", run_id, "--co", "-q"], cwd=killed_results.parent / "work",
                          env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0] == (f"kvbench: --kvbench-resume {run_id} found the run damaged and repaired it before running: "
                        f"1 line(s) of records.jsonl that are not records (line 2) moved to records.jsonl.damaged; "
                        f"run.json could not be read: kept as run.json.damaged, written again by this run")
    assert (run_dir / "records.jsonl.damaged").read_text() == "garbage\n"


def test_kill_9_before_the_first_record_leaves_a_run_that_names_every_item(capsys, killed_before_any_record):
    results, run_id = killed_before_any_record
    assert records(results, run_id) == []
    state = assert_one_state(capsys, results, run_id)
    assert "2 item(s) not finished" in state and FIRST in state and SECOND in state


def test_a_lock_only_folder_is_started_no_item_finished_and_can_be_resumed_or_cleaned(capsys, tmp_path):
    results = tmp_path / "res"
    folder = results / "runs" / "bench_0123abcd_20261127_100000"
    RunLock(folder).acquire().release()  # what a run killed as it started leaves: its lock files only
    assert assert_one_state(capsys, results, folder.name).startswith("started, no item finished")
    code, out, err = kvbench(capsys, results, "clean", folder.name)
    assert code == 0 and not folder.exists(), (out, err)


def test_a_killed_xdist_worker_leaves_its_item_unfinished_in_every_command(capsys, tmp_path):
    """The worker dies inside the item (kill -9, as the OOM killer): a crash record, the item not finished; what
    a later record of that item supersedes is tested in tests/results/test_run_state.py (one process)."""
    bench = Bench(tmp_path / "work", tmp_path / "res", "-n", "2", block=SECOND)
    os.kill(bench.blocked_pid(), signal.SIGKILL)
    proc = bench.finish()
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    results, run_id = tmp_path / "res", only_run(tmp_path / "res")
    (crash,) = [r for r in records(results, run_id) if r["item_id"] == SECOND]
    assert crash["crashed"] and crash["status"] == "error"
    assert assert_one_state(capsys, results, run_id) == f"incomplete: 1 item(s) not finished ({SECOND})"
    document = run_json(results, run_id)
    assert document["complete"] is False and [u["item_id"] for u in document["unfinished"]] == [SECOND]


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["serial", "xdist"])
def test_ctrl_c_inside_an_item_reads_incomplete_everywhere(capsys, tmp_path, xdist):
    bench = Bench(tmp_path / "work", tmp_path / "res", *xdist, block=SECOND)
    bench.blocked_pid()
    bench.signal_group(signal.SIGINT)
    proc = bench.finish()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, proc.stdout[-3000:] + proc.stderr[-2000:]
    results, run_id = tmp_path / "res", only_run(tmp_path / "res")
    state = assert_one_state(capsys, results, run_id)
    assert state.startswith("incomplete: ") and SECOND in state
    assert SECOND in [u["item_id"] for u in run_json(results, run_id)["unfinished"]]


def test_two_resumes_the_second_refused_naming_the_holder_then_a_merge_and_a_compare(
        capsys, tmp_path, killed_in_second_item, killed_before_any_record):
    killed_results, killed_id = killed_in_second_item
    results = tmp_path / "res"
    shutil.copytree(killed_results, results)
    kept = tmp_path / "kept"
    shutil.copytree(killed_results, kept)  # the killed run as it was, for the merge below

    holder = Bench(tmp_path / "a", results, "--kvbench-resume", killed_id, block=SECOND)
    pid = holder.blocked_pid()
    second = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *GRID, "--kvbench-results",
                             str(results), "--kvbench-resume", killed_id], cwd=tmp_path / "a",
                            env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=600)
    lines = [line for line in second.stderr.splitlines() if line.strip()]
    assert second.returncode == pytest.ExitCode.USAGE_ERROR and len(lines) == 1, second.stdout[-2000:] + second.stderr
    assert f"run {killed_id} is in use by process {pid} on " in lines[0]
    holder.go_on()
    proc = holder.finish()
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert assert_one_state(capsys, results, killed_id) == "complete"

    # merge of the killed run (as it was) with the run killed before any record: the merged run is incomplete
    before_id = killed_before_any_record[1]
    shutil.copytree(killed_before_any_record[0] / "runs" / before_id, kept / "runs" / before_id)
    code, out, err = kvbench(capsys, kept, "merge", killed_id, before_id)
    assert code == 0, err
    merged_id = out.split(" into ")[1].split()[0]
    merged = run_json(kept, merged_id)
    assert merged["complete"] is False and [u["item_id"] for u in merged["unfinished"]] == [SECOND]
    state = assert_one_state(capsys, kept, merged_id)
    assert state.startswith("incomplete") and f"1 item(s) not finished ({SECOND})" in state
    assert f"run {killed_id} is incomplete" in out  # merge names its inputs' states

    # compare against the killed run: both runs' states are named before the verdicts
    code, out, err = kvbench(capsys, kept, "compare", killed_id, merged_id)
    assert f"run {killed_id} is {assert_one_state(capsys, kept, killed_id)}" in out
