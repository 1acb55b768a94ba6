"""--kvbench-mlflow against a real MLflow tracking server on loopback (started and stopped here), read back with
MlflowClient: params, every item's metrics, artifacts, status; a run interrupted mid-way ends KILLED and its resume
continues the same MLflow run; a store that fails mid-run is one summary line and the run is complete.

The server tests need the `mlflow` package (the server), the others the `[mlflow]` extra's client; where they are
missing these tests skip (.ci/check_skips.py expects that in the main environment), and .ci/trackers-env.sh runs
them in an environment with both, where a skip fails CI.
"""

import json
import os
from importlib import metadata
import queue
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from helpers import SMALL_GRID, run_bench
from pytest_kvbench.results.run.directories import load_run
from pytest_kvbench.wiring.trackers.content import grid_params, item_metrics, item_name

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

mlflow = pytest.importorskip("mlflow", reason="the [mlflow] extra is not installed (No module named 'mlflow')")
SERVER_WAIT_S = 240  # a loaded 2-core CI machine starts the server in ~40 s
GRID = [a if a != "full,streamingllm,snapkv" else "full,snapkv" for a in SMALL_GRID]


def has_server() -> bool:
    """The full `mlflow` distribution (the server); the extra's `mlflow-skinny` is the client only."""
    try:
        return bool(metadata.version("mlflow"))
    except metadata.PackageNotFoundError:
        return False


needs_server = pytest.mark.skipif(not has_server(), reason="the mlflow server is not installed (pip install mlflow; "
                                                           "the [mlflow] extra has the client only)")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`mlflow server` on 127.0.0.1 at a free port, one worker, no job runner, in its own process group (stopped
    whole); ready when uvicorn says its application started, within SERVER_WAIT_S."""
    if not has_server():
        pytest.skip("the mlflow server is not installed (pip install mlflow; the [mlflow] extra has the client only)")
    base = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{base / 'mlflow.db'}", "--artifacts-destination", str(base / "artifacts")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env=dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"))  # no job runner: 7 idle processes less
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    seen = []
    try:
        while True:
            line = lines.get(timeout=SERVER_WAIT_S)
            seen.append(line)
            if "Application startup complete" in line:
                break
            assert proc.poll() is None, "mlflow server exited: " + "".join(seen[-10:])
        yield f"http://127.0.0.1:{port}"
    except queue.Empty:
        pytest.fail(f"mlflow server not ready after {SERVER_WAIT_S} s: " + "".join(seen[-10:]))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def mlflow_run(uri: str, run_id: str):
    client = mlflow.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("kvbench")
    (found,) = client.search_runs([experiment.experiment_id], filter_string=f"tags.`kvbench.run_id` = '{run_id}'")
    return client, found


def check_items_logged(client, found, run) -> None:
    """Every record's metrics, as the items view computes them, are the MLflow run's (a crashed item has none)."""
    assert run.records
    for record in run.records:
        expected = item_metrics(record, run.run_id)
        assert bool(expected) == record.is_scored, record.key
        for name, value in expected.items():
            history = client.get_metric_history(found.info.run_id, name)
            assert [m.value for m in history] == pytest.approx([value]), name


@needs_server
def test_a_run_logs_params_every_item_artifacts_and_its_status(server, tmp_path):
    results = tmp_path / "res"
    proc = run_bench(tmp_path / "work", *GRID, "--kvbench-results", str(results), "--kvbench-mlflow", server)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    (run_dir,) = (results / "runs").iterdir()
    run = load_run(run_dir)
    client, found = mlflow_run(server, run.run_id)
    assert found.info.status == "FINISHED" and found.info.run_name == run.run_id
    settings = json.loads((run_dir / "settings.json").read_text())
    assert found.data.params == grid_params(settings)
    environment = run.info["environment"]
    assert found.data.tags["kvbench.command"] == environment["command"]
    assert found.data.tags.get("kvbench.commit") == environment.get("git_commit")
    check_items_logged(client, found, run)
    steps = sorted({m.step for r in run.records for m in client.get_metric_history(
        found.info.run_id, f"{item_name(r)}/score")})
    assert steps == list(range(1, len(run.records) + 1))  # one step per item, as each finished
    artifacts = {a.path for a in client.list_artifacts(found.info.run_id)}
    assert artifacts == {"RESULTS.md", "run.json", "report.html", "items.json"}
    local = Path(client.download_artifacts(found.info.run_id, "run.json", str(tmp_path / "down")))
    assert json.loads(local.read_text())["run_id"] == run.run_id
    assert f"kvbench: logged to MLflow run {found.info.run_id} at {server}" in proc.stdout


@needs_server
def test_an_interrupted_run_ends_killed_and_its_resume_continues_the_same_mlflow_run(server, tmp_path):
    work, results = tmp_path / "work", tmp_path / "res"
    run_bench(work, "--collect-only", "-q")  # lays out the bench files and the conftest
    grid = [a if a != "2" else "3" for a in GRID]  # 4 items of 3 samples: time to interrupt after the first
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-v", *grid,
                             "--kvbench-results", str(results), "--kvbench-mlflow", server],
                            cwd=work, env=dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    for line in proc.stdout:  # the first item's PASSED line: its record is written and logged
        output.append(line)
        if " PASSED" in line:
            proc.send_signal(signal.SIGINT)
            break
    output += proc.stdout.read()
    assert proc.wait(timeout=600) == 2, "".join(output[-40:])
    (run_dir,) = (results / "runs").iterdir()
    run = load_run(run_dir)
    assert not run.state.complete and run.records
    client, found = mlflow_run(server, run.run_id)
    assert found.info.status == "KILLED"
    check_items_logged(client, found, run)
    resumed = run_bench(work, *grid, "--kvbench-results", str(results), "--kvbench-mlflow", server,
                        "--kvbench-resume", run.run_id)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    run = load_run(run_dir)
    assert run.state.complete and len(run.records) == 4
    client, again = mlflow_run(server, run.run_id)  # the same MLflow run, now with every item
    assert again.info.run_id == found.info.run_id and again.info.status == "FINISHED"
    check_items_logged(client, again, run)


def test_a_store_failing_mid_run_is_one_summary_line_and_the_run_is_complete(tmp_path):
    store = tmp_path / "mlruns"
    work = tmp_path / "work"
    work.mkdir()
    # after the startup check passed, the store becomes unusable: a file where its directory was
    (work / "conftest.py").write_text(
        "import shutil\nfrom pathlib import Path\n\n\ndef pytest_collection_finish(session):\n"
        f"    shutil.rmtree({str(store)!r})\n    Path({str(store)!r}).write_text('not a store')\n")
    proc = run_bench(work, *GRID, "--kvbench-results", str(tmp_path / "res"), "--kvbench-mlflow", store.as_uri())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    said = [line for line in proc.stdout.splitlines() if "MLflow stopped logging" in line]
    assert len(said) == 1 and said[0].startswith("kvbench: MLflow stopped logging at the start of the run: ")
    assert said[0].endswith("; the run and its records are complete without it")
    (run_dir,) = (tmp_path / "res" / "runs").iterdir()
    run = load_run(run_dir)
    assert run.state.complete and len(run.records) == 4


def test_an_unreachable_server_is_one_line_at_startup(tmp_path):
    proc = run_bench(tmp_path / "work", *GRID, "--kvbench-results", str(tmp_path / "res"),
                     "--kvbench-mlflow", f"http://127.0.0.1:{free_port()}")
    assert proc.returncode == 4
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"ERROR: --kvbench-mlflow http://127.0.0.1:") and "does not answer" in lines[0]
    assert not (tmp_path / "res").exists()  # nothing ran, nothing written


def test_file_store_logs_the_run(tmp_path):
    store = tmp_path / "mlruns"
    proc = run_bench(tmp_path / "work", *GRID, "--kvbench-results", str(tmp_path / "res"),
                     "--kvbench-mlflow", store.as_uri())
    assert proc.returncode == 0, proc.stdout[-3000:]
    (run_dir,) = (tmp_path / "res" / "runs").iterdir()
    run = load_run(run_dir)
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client, found = mlflow_run(store.as_uri(), run.run_id)
    assert found.info.status == "FINISHED"
    check_items_logged(client, found, run)



def test_under_xdist_the_controller_logs_every_item_once(tmp_path):
    store = tmp_path / "mlruns"
    proc = run_bench(tmp_path / "work", *GRID, "-n", "2", "--dist", "loadgroup", "--kvbench-results",
                     str(tmp_path / "res"), "--kvbench-mlflow", store.as_uri())
    assert proc.returncode == 0, proc.stdout[-3000:]
    (run_dir,) = (tmp_path / "res" / "runs").iterdir()
    run = load_run(run_dir)
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client, found = mlflow_run(store.as_uri(), run.run_id)  # one MLflow run: the workers made none
    assert found.info.status == "FINISHED"
    check_items_logged(client, found, run)  # each metric once
    steps = sorted(m.step for r in run.records for m in client.get_metric_history(
        found.info.run_id, f"{item_name(r)}/score"))
    assert steps == list(range(1, len(run.records) + 1))


def test_a_run_whose_worker_crashed_ends_failed(tmp_path):
    store, work = tmp_path / "mlruns", tmp_path / "work"
    work.mkdir()
    killed = "snapkv-32-niah_single_1-ctx256"
    (work / "conftest.py").write_text(  # the worker dies inside one item, as under the OOM killer
        "import os, signal\n\n\ndef pytest_runtest_call(item):\n"
        f"    if item.nodeid.endswith('[{killed}]'):\n        os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = run_bench(work, *GRID, "-n", "2", "--dist", "loadgroup", "--kvbench-results", str(tmp_path / "res"),
                     "--kvbench-mlflow", store.as_uri())
    assert proc.returncode != 0
    (run_dir,) = (tmp_path / "res" / "runs").iterdir()
    run = load_run(run_dir)
    assert [u["item_id"] for u in run.state.unfinished_items] == [killed]
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client, found = mlflow_run(store.as_uri(), run.run_id)
    assert found.info.status == "FAILED"
    check_items_logged(client, found, run)  # the items that finished are there
