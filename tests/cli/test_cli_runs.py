"""kvbench list / show / merge and run lookup, on run directories shaped as the harness writes them."""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli_support import (
    ENVIRONMENT,
    OTHER_ID,
    RUN_ID,
    assert_usage_error,
    make_record,
    run_cli,
    standard_records,
    write_run,
)

from pytest_kvbench.cli import main
from pytest_kvbench.results.run import storage
from pytest_kvbench.results.run.merge import merge_runs
from pytest_kvbench.results.run.directories import RunError, list_runs, load_run

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


@pytest.fixture
def results(tmp_path):
    write_run(tmp_path, standard_records())
    write_run(tmp_path, [make_record(method="tova", params={}, task="qasper")], run_id=OTHER_ID,
              environment=ENVIRONMENT | {"git_commit": "b" * 40})
    return tmp_path


# -- list -------------------------------------------------------------------------------------


def test_list_shows_id_date_models_methods_budgets_tasks_commit(capsys, results):
    code, out, _ = run_cli(capsys, "list", "--results", results)
    assert code == 0
    first = next(line for line in out.splitlines() if line.startswith(RUN_ID))
    for text in ("2025-01-02", "default", "full, snapkv, streamingllm", "full, 128, 512", "qasper, hotpotqa",
                 ENVIRONMENT["git_commit"][:10], "complete"):
        assert text in first
    assert any(line.startswith(OTHER_ID) and "tova" in line for line in out.splitlines())


def test_list_as_json_and_results_before_the_verb(capsys, results):
    code, out, _ = run_cli(capsys, "--results", results, "list", "--json")
    listed = json.loads(out)
    assert code == 0 and [r["run_id"] for r in listed] == [RUN_ID, OTHER_ID]
    assert listed[0]["items"] == 10 and listed[0]["complete"] is True


def test_list_keeps_going_past_a_corrupt_run(capsys, results):
    (results / "runs" / OTHER_ID / "run.json").write_text("{broken")
    code, out, _ = run_cli(capsys, "list", "--results", results)
    assert code == 0
    assert RUN_ID in out
    damaged = next(line for line in out.splitlines() if line.startswith(OTHER_ID))
    assert "tova" in damaged and "damaged (" in damaged and "invalid JSON" in damaged  # its records recovered
    (results / "runs" / OTHER_ID / "records.jsonl").write_text("{broken}\n")
    code, out, _ = run_cli(capsys, "list", "--results", results)
    assert code == 0
    assert any(OTHER_ID in line and "unreadable" in line and "invalid JSON" in line for line in out.splitlines())


def test_list_of_an_empty_results_directory(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "list", "--results", tmp_path)
    assert code == 0 and "no runs" in out


# -- show -------------------------------------------------------------------------------------


def test_show_prints_tables_items_and_environment(capsys, results):
    code, out, _ = run_cli(capsys, "show", RUN_ID, "--results", results)
    assert code == 0
    assert f"run {RUN_ID} (complete)" in out
    assert "## default — budget 128" in out and "## default — budget 512" in out
    assert "| full" in out and "| snapkv" in out and "Avg" in out
    assert "snapkv-128-qasper" in out  # per-item table
    assert "device: NVIDIA H100 (cuda, driver 550.54.15)" in out  # from the records
    assert f"git_commit: {ENVIRONMENT['git_commit']}" in out
    assert "torch=2.13.0" in out


def test_show_reproduce_prints_the_exact_commit_and_command(capsys, results):
    code, out, _ = run_cli(capsys, "show", RUN_ID, "--reproduce", "--results", results)
    assert code == 0
    assert out.splitlines() == [f"git checkout {ENVIRONMENT['git_commit']}",
                                f"cd {shlex.quote(ENVIRONMENT['cwd'])}", ENVIRONMENT["command"]]


def test_reproduce_warns_about_a_dirty_tree_and_fails_without_a_command(capsys, tmp_path):
    write_run(tmp_path, [make_record()], environment=ENVIRONMENT | {"git_dirty": True})
    code, out, _ = run_cli(capsys, "show", RUN_ID, "--reproduce", "--results", tmp_path)
    assert code == 0 and "uncommitted changes" in out.splitlines()[0]
    write_run(tmp_path, [make_record()], run_id=OTHER_ID, environment={"git_commit": "abc"})
    code, _, err = run_cli(capsys, "show", OTHER_ID, "--reproduce", "--results", tmp_path)
    assert_usage_error(code, err, OTHER_ID, "does not record the command")


# -- finding runs -------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [RUN_ID, "bench_0a1b", "0a1b", "latest"])
def test_runs_are_found_by_id_prefix_hex_prefix_and_latest(results, spec):
    expected = OTHER_ID if spec == "latest" else RUN_ID
    assert load_run(spec, results).run_id == expected


def test_a_run_directory_path_works_too(capsys, results):
    code, out, _ = run_cli(capsys, "show", results / "runs" / RUN_ID)
    assert code == 0 and RUN_ID in out


def test_ambiguous_and_unknown_ids_are_one_line_errors(capsys, results):
    code, _, err = run_cli(capsys, "show", "bench_", "--results", results)
    assert_usage_error(code, err, "ambiguous", RUN_ID, OTHER_ID)
    code, _, err = run_cli(capsys, "show", "bench_ffff", "--results", results)
    assert_usage_error(code, err, "no run 'bench_ffff'", "kvbench list")
    code, _, err = run_cli(capsys, "show", "anything", "--results", results / "missing")
    assert_usage_error(code, err, "does not exist")


def test_bad_command_line_is_one_line_exit_2(capsys):
    code = None
    with pytest.raises(SystemExit) as info:
        main(["export", "x", "--format", "docx"])
    _, err = capsys.readouterr()
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1 and "invalid choice" in err
    code = main([])
    assert code == 2


def test_help_lists_every_verb(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    out, _ = capsys.readouterr()
    assert info.value.code == 0
    for verb in ("list", "show", "compare", "export", "report", "merge", "variance", "coverage"):
        assert verb in out


def test_the_command_as_a_process_exits_2_with_one_line_and_no_traceback(results):
    """What CI sees: the real exit status and stderr of the `kvbench` entry point."""
    (results / "runs" / RUN_ID / "run.json").write_text("not json")
    root = Path(__file__).resolve().parents[2]
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    completed = subprocess.run([sys.executable, "-m", "pytest_kvbench.cli", "show", RUN_ID, "--results", str(results)],
                               capture_output=True, text=True, env=env, timeout=120, check=False)
    assert completed.returncode == 2
    assert completed.stderr.count("\n") == 1 and "Traceback" not in completed.stderr
    assert "run.json: invalid JSON at line 1" in completed.stderr


# -- corrupt files ------------------------------------------------------------------------------


def test_a_malformed_record_line_is_named_with_file_and_line(capsys, results):
    path = results / "runs" / RUN_ID / "records.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = lines[2][:40] + "}"  # not a torn write (those never end in the closing brace)
    path.write_text("\n".join(lines) + "\n")
    code, _, err = run_cli(capsys, "show", RUN_ID, "--results", results)
    assert_usage_error(code, err, f"{path}:3", "not a JSON record")


def test_a_torn_last_line_from_a_crash_is_dropped(results):
    path = results / "runs" / RUN_ID / "records.jsonl"
    path.write_text(path.read_text() + '{"key": "half')
    assert len(load_run(RUN_ID, results).records) == 10


def test_records_that_are_not_records_are_refused(capsys, results):
    path = results / "runs" / RUN_ID / "records.jsonl"
    path.write_text('{"key": "a"}\n[1, 2]\n')
    code, _, err = run_cli(capsys, "show", RUN_ID, "--results", results)
    assert_usage_error(code, err, str(path), "record 1")


def test_a_record_without_its_task_name_is_refused(capsys, results):
    path = results / "runs" / RUN_ID / "records.jsonl"
    record = make_record()
    del record["task"]["name"]
    path.write_text(json.dumps(record) + "\n")
    code, _, err = run_cli(capsys, "export", RUN_ID, "--format", "csv", "--results", results)
    assert_usage_error(code, err, str(path), "record 1", "'task' object with a 'name'")


def test_corrupt_run_json_is_named(capsys, results):
    path = results / "runs" / RUN_ID / "run.json"
    path.write_text('{"run_id": ')
    code, _, err = run_cli(capsys, "show", RUN_ID, "--results", results)
    assert_usage_error(code, err, str(path), "invalid JSON at line 1")


def test_binary_garbage_is_named(capsys, results):
    path = results / "runs" / RUN_ID / "records.jsonl"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    code, _, err = run_cli(capsys, "show", RUN_ID, "--results", results)
    assert_usage_error(code, err, str(path))


def test_a_crashed_run_without_run_json_is_readable_and_incomplete(capsys, tmp_path):
    write_run(tmp_path, standard_records(), with_run_json=False)
    run = load_run(RUN_ID, tmp_path)
    assert len(run.records) == 10 and not run.complete and run.started is not None
    code, out, _ = run_cli(capsys, "list", "--results", tmp_path)
    assert code == 0 and "incomplete" in out


def test_a_retried_item_counts_once_with_its_last_record(tmp_path):
    first = make_record([0, 0], status="failed")
    retry = make_record([1, 1])
    write_run(tmp_path, [first, retry])
    (record,) = load_run(RUN_ID, tmp_path).records
    assert record.score == 100.0


def test_runs_written_by_the_harness_session_read_back(tmp_path):
    """The lead's RunSession writes the directory; run/directories.py must read exactly that."""
    from kvmethods import Budget
    from pytest_kvbench.cases import Grid, MethodSpec
    from pytest_kvbench.wiring.session import RunSession

    grid = Grid(methods=[MethodSpec("snapkv")], budgets=[Budget.parse("128")], tasks=["qasper"])
    session = RunSession(grid, tmp_path, RUN_ID, is_controller=True, environment=ENVIRONMENT)
    for record in standard_records()[:3]:
        session.add(record)
    session.finish(complete=True)
    run = load_run(RUN_ID, tmp_path)
    assert run.complete and run.commit == ENVIRONMENT["git_commit"] and len(run.records) == 3
    assert list_runs(tmp_path)[0].run_id == RUN_ID


# -- merge ----------------------------------------------------------------------------------------


def test_merge_combines_runs_from_several_machines(capsys, tmp_path):
    machine_a = write_run(tmp_path, standard_records(seeds=(0,)))
    machine_b = write_run(tmp_path, standard_records(run_id=OTHER_ID, seeds=(1,)), run_id=OTHER_ID,
                          environment=ENVIRONMENT | {"host": "gpu-node-2"})
    before = {p: p.read_bytes() for p in (machine_a / "records.jsonl", machine_b / "records.jsonl")}
    code, out, _ = run_cli(capsys, "merge", machine_a, machine_b, "--results", tmp_path)
    assert code == 0 and "merged 2 runs (20 items)" in out
    merged_id = out.split(" into ")[1].split()[0]
    merged = load_run(merged_id, tmp_path)
    assert len(merged.records) == 20 and {r.seed for r in merged.records} == {0, 1}
    assert {r.run_id for r in merged.records} == {merged_id}
    assert {r.merged_from_run for r in merged.records} == {RUN_ID, OTHER_ID}
    assert [m["run_id"] for m in merged.info["merged_from"]] == [RUN_ID, OTHER_ID]
    assert merged.info["grid"]["seeds"] == [0, 1] and merged.complete
    item = merged.path / "snapkv_default_128" / "qasper_seed1"
    assert (item / "predictions.jsonl").exists() and json.loads((item / "metrics.json").read_text())["seed"] == 1
    assert (merged.path / "RESULTS.md").exists()
    assert before == {p: p.read_bytes() for p in before}, "inputs must not change"
    code, out, _ = run_cli(capsys, "show", merged_id, "--reproduce", "--results", tmp_path)
    assert out.count(ENVIRONMENT["command"]) == 2


def test_merge_refuses_an_item_present_in_two_runs_and_writes_nothing(capsys, tmp_path):
    write_run(tmp_path, standard_records())
    write_run(tmp_path, standard_records(run_id=OTHER_ID), run_id=OTHER_ID)
    code, _, err = run_cli(capsys, "merge", RUN_ID, OTHER_ID, "--results", tmp_path)
    assert_usage_error(code, err, "is in both", RUN_ID, OTHER_ID)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [RUN_ID, OTHER_ID]


def test_merge_refuses_runs_with_different_protocols(tmp_path):
    write_run(tmp_path, standard_records(seeds=(0,)))
    records = standard_records(run_id=OTHER_ID, seeds=(1,))
    grid = json.loads((tmp_path / "runs" / RUN_ID / "run.json").read_text())["grid"] | {"protocol": "query_agnostic"}
    write_run(tmp_path, records, run_id=OTHER_ID, grid=grid)
    with pytest.raises(RunError, match="different protocol"):
        merge_runs([RUN_ID, OTHER_ID], tmp_path)


@pytest.mark.parametrize("field, value", [("storage_budgets", 5), ("budgets", "128"), ("methods", {"name": "x"})])
def test_merge_refuses_a_grid_list_that_is_not_a_list_in_one_line_and_writes_nothing(capsys, tmp_path, field, value):
    write_run(tmp_path, standard_records(seeds=(0,)))
    grid = json.loads((tmp_path / "runs" / RUN_ID / "run.json").read_text())["grid"] | {field: value}
    write_run(tmp_path, standard_records(run_id=OTHER_ID, seeds=(1,)), run_id=OTHER_ID, grid=grid)
    code, _, err = run_cli(capsys, "merge", RUN_ID, OTHER_ID, "--results", tmp_path)
    assert_usage_error(code, err, OTHER_ID, f"grid field {field!r}", "not a list")
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [RUN_ID, OTHER_ID]


def test_merge_keeps_the_storage_budgets_of_the_runs_that_set_them(capsys, tmp_path):
    write_run(tmp_path, standard_records(seeds=(0,)))
    grid = json.loads((tmp_path / "runs" / RUN_ID / "run.json").read_text())["grid"] | {"storage_budgets": ["m0.125"]}
    write_run(tmp_path, standard_records(run_id=OTHER_ID, seeds=(1,)), run_id=OTHER_ID, grid=grid)
    code, out, _ = run_cli(capsys, "merge", RUN_ID, OTHER_ID, "--results", tmp_path)
    assert code == 0
    assert load_run(out.split(" into ")[1].split()[0], tmp_path).info["grid"]["storage_budgets"] == ["m0.125"]


def test_merge_needs_two_distinct_runs(tmp_path):
    write_run(tmp_path, standard_records())
    with pytest.raises(RunError, match="at least two"):
        merge_runs([RUN_ID], tmp_path)
    with pytest.raises(RunError, match="given twice"):
        merge_runs([RUN_ID, RUN_ID], tmp_path)
    assert storage.RUN_FILE in {p.name for p in (tmp_path / "runs" / RUN_ID).iterdir()}
