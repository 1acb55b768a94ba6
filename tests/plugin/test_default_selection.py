"""The default selection of `pytest bench/` on the embedded model: only tasks its full cache scores on,
the others selectable by name (--kvbench-tasks, -m, -k), the smoke subset unchanged."""

import json
import shutil

import pytest

from helpers import BENCH, collected_ids, run_bench
from pytest_kvbench.engine.models import DEFAULT_MODEL_DIR
from pytest_kvbench.tasks import runnable
from pytest_kvbench.wiring.default_selection import full_cache_scores, unscored_tasks
from pytest_kvbench.wiring.grid import command_line

DEFAULT_TASKS = runnable(command_line.DEFAULT_TASKS)  # the default grid, as configure resolves it
SMOKE_TASKS = runnable(command_line.SMOKE_TASKS)


def base(task: str) -> str:
    return task.split(":", 1)[0]


SCORED = [task for task in DEFAULT_TASKS if base(task) not in unscored_tasks()]
UNSCORED = [task for task in DEFAULT_TASKS if base(task) in unscored_tasks()]
ONE_METHOD = ["--kvbench-methods", "full,snapkv", "--kvbench-budgets", "128"]


def tasks_of(ids: list[str]) -> set[str]:
    return {task for task in DEFAULT_TASKS for item in ids if f"-{task}" in item}


def test_every_default_task_has_a_measured_full_cache_score():
    assert {base(task) for task in DEFAULT_TASKS} <= set(full_cache_scores())
    assert SCORED and UNSCORED  # both kinds exist: the selection leaves something out and keeps something


def test_the_default_selection_runs_only_the_scored_tasks(bench):
    result = bench.runpytest("--collect-only", "-q", *ONE_METHOD)
    assert tasks_of(collected_ids(result)) == set(SCORED)
    assert f"{len(UNSCORED) * 2} deselected" in result.stdout.str()
    header = bench.runpytest("--collect-only", *ONE_METHOD).stdout.str()
    assert "default selection" in header and all(task in header for task in UNSCORED)


def test_without_any_kvbench_option_the_benchmark_comes_in_at_its_module(bench):
    """No option: the plugin registers the benchmark before bench/'s modules are imported (plugin.py), selects the
    same items, and names the tasks left out after collection (the header was written before it came in)."""
    assert tasks_of(collected_ids(bench.runpytest("--collect-only", "-q"))) == set(SCORED)
    out = bench.runpytest("--collect-only").stdout.str()
    assert "default selection" in out and all(task in out for task in UNSCORED)


@pytest.mark.parametrize("select", [["-k", "passkey"], ["--kvbench-tasks", "passkey"]])
def test_a_task_left_out_stays_selectable(bench, select):
    ids = collected_ids(bench.runpytest("--collect-only", "-q", *ONE_METHOD, *select))
    assert sorted(ids) == ["full-passkey", "snapkv-128-passkey"]


def test_a_suite_marker_selects_the_left_out_task_among_its_suite(bench):
    """-m infinitebench: passkey (left out by default) runs, with the rest of its suite (test_named_tasks.py)."""
    ids = collected_ids(bench.runpytest("--collect-only", "-q", *ONE_METHOD, "-m", "infinitebench"))
    assert {"full-passkey", "snapkv-128-passkey"} <= set(ids) and len(ids) > 2


def test_the_smoke_subset_is_the_whole_grids(bench):
    ids = collected_ids(bench.runpytest("--collect-only", "-q", *ONE_METHOD, "-m", "smoke"))
    assert tasks_of(ids) == set(SMOKE_TASKS) and len(ids) == 2 * len(SMOKE_TASKS)


def test_another_model_keeps_every_task(bench, tmp_path):
    model_dir = tmp_path / "other"
    shutil.copytree(DEFAULT_MODEL_DIR, model_dir)  # a whole model: config, weights, tokenizer
    result = bench.runpytest("--collect-only", "-q", *ONE_METHOD, "--kvbench-model", str(model_dir))
    assert tasks_of(collected_ids(result)) == set(DEFAULT_TASKS)
    assert "deselected" not in result.stdout.str()


def test_the_full_cache_scores_on_every_task_of_the_default_selection(tmp_path):
    """Re-measures what task_scores.toml says of the kept tasks (6 samples: lcc's first scored sample is its 4th)."""
    work = tmp_path / "work"
    work.mkdir()
    for path in BENCH.glob("test_*.py"):
        if path.name != "test_kernels.py":
            (work / path.name).write_text(path.read_text())
    proc = run_bench(work, "--kvbench-methods", "full", "--kvbench-samples", "6", "--kvbench-torch-threads", "1",
                     "-q", "--kvbench-results", str(tmp_path / "res"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    records = [json.loads(line) for line in next((tmp_path / "res" / "runs").glob("*/records.jsonl")).read_text().splitlines()]
    scores = {record["task"]["name"]: record["score"] for record in records}
    assert set(scores) == set(SCORED)
    assert all(score > 0 for score in scores.values()), scores


def test_a_broken_scores_file_is_one_line_naming_it(bench, tmp_path, monkeypatch):
    from pytest_kvbench.wiring import default_selection

    broken = tmp_path / "task_scores.toml"
    broken.write_text("[full_cache_scores\nlcc = 1\n")
    monkeypatch.setattr(default_selection, "SCORES_FILE", broken)
    default_selection.full_cache_scores.cache_clear()
    try:
        result = bench.runpytest("--collect-only", "-q", *ONE_METHOD)
    finally:
        default_selection.full_cache_scores.cache_clear()
    assert result.ret == 4
    errors = [line for line in result.stderr.lines if "task_scores.toml" in line]
    assert len(errors) == 1 and "reinstall pytest-kvbench" in errors[0] and "Traceback" not in result.stderr.str()
