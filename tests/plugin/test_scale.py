"""Scale and resilience: xdist workers, killed workers, concurrent appends, resume, shards, Ctrl-C."""

import json
import multiprocessing

import pytest

from helpers import HOOK_CONFTEST, SMALL_GRID, run_bench
from pytest_kvbench.results.run import storage

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


def run_json(results):
    (run_dir,) = (results / "runs").iterdir()
    return run_dir, json.loads((run_dir / "run.json").read_text())


def by_item(records):
    return {r["item_id"]: r for r in records}


def test_two_workers_record_everything_once_with_the_same_scores(small_run, tmp_path):
    _, _, serial_results, _ = small_run
    results = tmp_path / "res"
    proc = run_bench(tmp_path / "work", *SMALL_GRID, "-n", "2", f"--kvbench-results={results}")
    assert proc.returncode == 0, proc.stdout[-3000:]
    run_dir, run = run_json(results)
    lines = storage.read_records(run_dir / "records.jsonl")
    assert len(lines) == 6 and len({r["nodeid"] for r in lines}) == 6
    parallel = by_item(run["records"])
    _, serial = run_json(serial_results)
    serial = by_item(serial["records"])
    assert parallel.keys() == serial.keys()
    for item_id, record in serial.items():
        assert parallel[item_id]["score"] == record["score"]
        assert [s["prediction"] for s in parallel[item_id]["samples"]] == [s["prediction"] for s in record["samples"]]


WHERE = """
import os
def pytest_runtest_call(item):
    with open(os.path.join(os.path.dirname(__file__), "where.txt"), "a") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"] + " " + item.callspec.id + "\\n")
"""


def test_loadgroup_keeps_each_task_on_one_worker_and_spreads_tasks(tmp_path):
    """Under --dist loadgroup a task's items share a worker (one reference pass per sample),
    and a one-model grid still uses both workers."""
    work = workdir_with(tmp_path, WHERE)
    proc = run_bench(work, *SMALL_GRID, "-n", "2", "--dist", "loadgroup", f"--kvbench-results={tmp_path / 'res'}")
    assert proc.returncode == 0, proc.stdout[-3000:]
    ran = [line.split() for line in (work / "where.txt").read_text().splitlines()]
    assert len(ran) == 6
    workers_of = {}
    for worker, item in ran:
        task = "niah_single_1" if "niah_single_1" in item else "passage_retrieval_en"
        workers_of.setdefault(task, set()).add(worker)
    assert all(len(workers) == 1 for workers in workers_of.values()), workers_of
    assert workers_of["niah_single_1"] != workers_of["passage_retrieval_en"]


KILLER = """
import os, signal
def pytest_runtest_call(item):
    if "snapkv-32-passage" in item.nodeid:
        os.kill(os.getpid(), signal.SIGKILL)
"""


def workdir_with(tmp_path, conftest: str):
    """A bench directory whose conftest records every item and adds ``conftest``'s hooks."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "conftest.py").write_text(HOOK_CONFTEST + conftest)
    return work


def test_a_worker_killed_mid_item_loses_only_that_item(tmp_path):
    work = workdir_with(tmp_path, KILLER)
    results = tmp_path / "res"
    proc = run_bench(work, *SMALL_GRID, "-n", "2", f"--kvbench-results={results}")
    assert "snapkv-32-passage_retrieval_en" in proc.stdout  # reported as crashed
    run_dir, run = run_json(results)
    finished = {r["item_id"] for r in run["records"] if r["status"] == "passed"}
    assert finished == {"full-passage_retrieval_en", "streamingllm-32-passage_retrieval_en", "full-niah_single_1-ctx256",
                        "streamingllm-32-niah_single_1-ctx256", "snapkv-32-niah_single_1-ctx256"}
    crashed = [r for r in run["records"] if r["status"] != "passed"]
    assert [(r["item_id"], r["status"], r.get("crashed")) for r in crashed] == [
        ("snapkv-32-passage_retrieval_en", "error", True)]
    assert not run["complete"] and [u["item_id"] for u in run["unfinished"]] == ["snapkv-32-passage_retrieval_en"]
    assert (results / "RESULTS.md").read_text().startswith("# Results")


def _append_many(path, worker, count):
    for i in range(count):
        storage.append_record(path, {"worker": worker, "i": i, "pad": "x" * (i % 97) * 10})


def test_concurrent_appends_lose_and_corrupt_nothing(tmp_path):
    path = tmp_path / "records.jsonl"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_many, args=(path, w, 500)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    records = storage.read_records(path, tolerate_torn=False)
    assert len(records) == 2000
    assert {(r["worker"], r["i"]) for r in records} == {(w, i) for w in range(4) for i in range(500)}


def test_a_torn_line_is_skipped_and_later_appends_survive(tmp_path):
    path = tmp_path / "records.jsonl"
    storage.append_record(path, {"a": 1})
    with open(path, "a") as handle:
        handle.write('{"a": 2, "trunc')
    assert storage.read_records(path) == [{"a": 1}]
    storage.append_record(path, {"a": 3})
    assert storage.read_records(path) == [{"a": 1}, {"a": 3}]
    with pytest.raises(storage.RecordsError, match="records.jsonl:2"):
        storage.read_records(path, tolerate_torn=False)


def test_resume_runs_only_missing_items_and_completes_the_run(small_run, tmp_path):
    _, _, serial_results, _ = small_run
    results = tmp_path / "res"
    # A crashed run: the same grid, two items finished.
    first = run_bench(tmp_path / "work", *SMALL_GRID, "--kvbench-results", str(results), "-k", "full")
    assert first.returncode == 0
    run_dir, run = run_json(results)
    (run_dir / "run.json").unlink()
    resumed = run_bench(tmp_path / "work", *SMALL_GRID, "--kvbench-results", str(results),
                        "--kvbench-resume", run_dir.name)
    assert resumed.returncode == 0, resumed.stdout[-3000:]
    assert "4 passed, 2 deselected" in resumed.stdout
    _, merged = run_json(results)
    _, clean = run_json(serial_results)
    assert {k: v["score"] for k, v in by_item(merged["records"]).items()} == \
        {k: v["score"] for k, v in by_item(clean["records"]).items()}


def test_resume_of_an_unknown_run_is_a_usage_error(tmp_path):
    proc = run_bench(tmp_path / "work", *SMALL_GRID, "--kvbench-results", str(tmp_path), "--kvbench-resume", "bench_nope")
    assert proc.returncode == 4
    assert "bench_nope" in proc.stderr and "Traceback" not in proc.stderr


def test_shards_cover_the_grid_exactly_once(tmp_path):
    grid = [*SMALL_GRID, "--kvbench-methods", "full,streamingllm,snapkv,h2o,tova", "--kvbench-budgets", "16,32",
            "--collect-only", "-q"]

    def ids(*extra):
        out = run_bench(tmp_path / "w", *grid, *extra).stdout
        return [line for line in out.splitlines() if "::" in line]

    everything = ids()
    parts = [ids("--kvbench-shard", f"{k}/3") for k in (1, 2, 3)]
    assert all(parts)
    assert sorted(sum(parts, [])) == sorted(everything)



def test_resuming_a_shard_runs_only_that_shards_missing_items(tmp_path):
    """A killed SLURM array task is finished with its own --kvbench-shard and --kvbench-resume: it must run
    the rest of its own part. Splitting what is left of the whole grid instead ran other shards' items,
    and the merge then refused the duplicates (found on a real one-node SLURM cluster, .ci/slurm.sh)."""
    results = tmp_path / "res"
    shard = [*SMALL_GRID, "--kvbench-shard", "2/3", "--kvbench-results", str(results)]
    first = run_bench(tmp_path / "work", *shard)
    assert first.returncode == 0, first.stdout[-3000:]
    run_dir, run = run_json(results)
    assert len(run["records"]) == 2
    # The task was killed after its first item: one record, no run.json.
    records = (run_dir / "records.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "records.jsonl").write_text(records[0])
    (run_dir / "run.json").unlink()
    missing = json.loads(records[1])["nodeid"].split("::")[-1]
    resumed = run_bench(tmp_path / "work", *shard, "--kvbench-resume", "latest", "--collect-only", "-q")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-2000:]
    assert [line.split("::")[-1] for line in resumed.stdout.splitlines() if "::" in line] == [missing]

INTERRUPT = """
def pytest_runtest_call(item):
    if "snapkv" in item.nodeid:
        raise KeyboardInterrupt
"""


def test_ctrl_c_writes_what_finished_marked_incomplete(tmp_path):
    work = workdir_with(tmp_path, INTERRUPT)
    results = tmp_path / "res"
    proc = run_bench(work, *SMALL_GRID, "--kvbench-results", str(results), "-k", "passage")
    assert proc.returncode == 2
    _, run = run_json(results)
    assert run["complete"] is False
    assert {r["item_id"] for r in run["records"]} == {"full-passage_retrieval_en", "streamingllm-32-passage_retrieval_en"}
    assert "(incomplete)" in (results / "RESULTS.md").read_text()
