"""Faults during and around a run: a killed xdist worker, a resume that would mix runs, and a
results path that cannot be written.

A run must never be called complete when an item has no result, must say which item is missing
and how to finish it, and must refuse (before any model loads) to write where it cannot or should
not: a results path that is a file, a directory outside the results tree, or a run made with other
settings.
"""

from __future__ import annotations

import json
import shutil
import struct

import pytest
from helpers import add_bench_files, run_bench

from pytest_kvbench import cli
from pytest_kvbench.engine import models
from pytest_kvbench.results.run import storage

# tests/conftest.py: not rerun on transformers 5.2; the model that cannot load is (transformers' loading error)
SESSION_LOGIC = pytest.mark.transformers_independent

KILLED = "streamingllm-32-passage_retrieval_en"
GRID = ["--kvbench-methods", "full,streamingllm", "--kvbench-budgets", "32", "--kvbench-tasks", "passage_retrieval_en",
        "--kvbench-samples", "1", "--kvbench-max-prompt-tokens", "200", "--kvbench-torch-threads", "1"]
KILL_CONFTEST = (
    "import os, signal\n"
    "def pytest_runtest_call(item):\n"
    "    target = os.environ.get('KVBENCH_TEST_KILL')\n"
    "    if target and item.nodeid.endswith(f'[{target}]'):\n"
    "        os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer or a node failure would\n"
)


@pytest.fixture(scope="module")
def crashed_run(tmp_path_factory):
    """A ``-n 2`` run whose worker is killed inside one item: (work dir, results dir, run id, process)."""
    work = tmp_path_factory.mktemp("crash") / "work"
    work.mkdir()
    (work / "conftest.py").write_text(KILL_CONFTEST)
    results = work / "res"
    proc = run_bench(work, "-n", "2", *GRID, "--kvbench-results", str(results), env={"KVBENCH_TEST_KILL": KILLED})
    runs = sorted((results / "runs").iterdir())
    assert len(runs) == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    return work, results, runs[0].name, proc


def run_json(results, run_id) -> dict:
    return json.loads((results / "runs" / run_id / storage.RUN_FILE).read_text())


@SESSION_LOGIC
def test_a_killed_worker_leaves_an_incomplete_run_naming_the_item_and_how_to_resume(crashed_run, capsys):
    work, results, run_id, proc = crashed_run
    assert proc.returncode == 1, proc.stdout[-3000:]
    run = run_json(results, run_id)
    assert run["complete"] is False
    assert [u["item_id"] for u in run["unfinished"]] == [KILLED]
    assert "crashed" in run["unfinished"][0]["reason"]
    assert f"--kvbench-resume {run_id}" in run["resume_command"]
    statuses = {r["item_id"]: r["status"] for r in run["records"]}
    assert statuses == {"full-passage_retrieval_en": "passed", KILLED: "error"}
    markdown = (results / "RESULTS.md").read_text()
    assert "## Items not finished" in markdown and f"`{KILLED}`: worker" in markdown
    assert f"is incomplete: 1 item(s) not finished ({KILLED})" in proc.stdout
    assert cli.main(["show", run_id, "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert f"run {run_id} (incomplete: 1 item(s) not finished ({KILLED}))" in out and f"not finished: {KILLED}" in out
    assert f"finish the run with: " in out and f"--kvbench-resume {run_id}" in out


@SESSION_LOGIC
def test_resume_with_changed_settings_is_refused_with_the_reason(crashed_run):
    work, results, run_id, _ = crashed_run
    records = (results / "runs" / run_id / storage.RECORDS_FILE).read_bytes()
    changed = [v if v != "1" else "2" for v in GRID]  # --kvbench-samples 1 -> 2 (and torch threads, no setting)
    proc = run_bench(work, *changed, "--kvbench-results", str(results), "--kvbench-resume", run_id)
    assert proc.returncode == 4
    assert "settings differ from the run's (samples: 1 -> 2)" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert (results / "runs" / run_id / storage.RECORDS_FILE).read_bytes() == records


@SESSION_LOGIC
def test_resume_into_a_foreign_directory_is_refused(crashed_run, pytester, tmp_path):
    _, results, run_id, _ = crashed_run
    foreign = tmp_path / "elsewhere" / run_id
    shutil.copytree(results / "runs" / run_id, foreign)
    before = sorted(p.name for p in foreign.iterdir())
    for target, message in ((str(foreign), "not a path"), (str(tmp_path), "not a path"), ("..", "not a path"),
                            (run_id, "no run")):
        result = pytester.runpytest_inprocess(*GRID, "--kvbench-results", str(tmp_path / "other_results"),
                                              "--kvbench-resume", target)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, target
        assert message in result.stderr.str(), (target, result.stderr.str())
    assert sorted(p.name for p in foreign.iterdir()) == before
    assert not (tmp_path / "other_results").exists()


@SESSION_LOGIC
def test_resume_runs_only_the_missing_item_and_completes_the_run(crashed_run, tmp_path):
    work, results, run_id, _ = crashed_run
    copy = tmp_path / "res"
    shutil.copytree(results, copy)
    proc = run_bench(work, *GRID, "--kvbench-results", str(copy), "--kvbench-resume", run_id)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed, 1 deselected" in proc.stdout
    run = run_json(copy, run_id)
    assert run["complete"] is True and run["unfinished"] == [] and run["resume_command"] is None
    assert {r["item_id"]: r["status"] for r in run["records"]} == {"full-passage_retrieval_en": "passed",
                                                                  KILLED: "passed"}
    # the crash record stays in records.jsonl as history; the re-run says it supersedes it, and nothing counts it
    lines = storage.read_records(copy / "runs" / run_id / storage.RECORDS_FILE)
    crash, rerun = [r for r in lines if r["item_id"] == KILLED]
    assert crash["crashed"] and rerun["status"] == "passed" and "crashed" not in rerun
    assert rerun["supersedes"] == {"status": "error", "message": crash["message"], "crashed": True}
    assert run["summary"]["by_status"] == {"passed": 2}


@SESSION_LOGIC
@pytest.mark.parametrize("results_path", ["a_file.txt", "a_file.txt/results"])
def test_an_unwritable_results_path_is_refused_before_any_model_loads(pytester, monkeypatch, results_path):
    add_bench_files(pytester)
    (pytester.path / "a_file.txt").write_text("keep me\n")
    loads = []
    monkeypatch.setattr(models.ModelCache, "_load", lambda self, *a: loads.append(a) or pytest.fail("model loaded"))
    result = pytester.runpytest_inprocess(*GRID, "-p", "no:cacheprovider", "--kvbench-results", results_path)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"--kvbench-results {results_path}:" in result.stderr.str()
    assert loads == [] and (pytester.path / "a_file.txt").read_text() == "keep me\n"


def test_a_model_that_cannot_load_fails_its_item_in_one_paragraph(tmp_path):
    """A folder with config, tokenizer and a whole safetensors file passes configure (a folder without weights or
    tokenizer, or with a file that is not safetensors or is truncated, is refused there: test_output_paths.py,
    test_startup_probes.py); weights that safetensors cannot read (a dtype it does not know) fail the item, briefly."""
    model = tmp_path / "corrupt_weights"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (model / name).write_text((models.DEFAULT_MODEL_DIR / name).read_text())
    header = json.dumps({"bogus": {"dtype": "XX", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(8))
    proc = run_bench(tmp_path / "work", "--kvbench-model", str(model), "--kvbench-data", "fixtures",
                     "--kvbench-methods", "full", "--kvbench-tasks", "passage_retrieval_en", "--kvbench-samples", "1",
                     "--kvbench-results", str(tmp_path / "res"), "-p", "no:cacheprovider")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    failures = proc.stdout.split("= FAILURES =")[1].split("short test summary")[0]
    assert "could not load model" in failures and "Traceback" not in failures
    assert len(failures.strip().splitlines()) < 8, failures
