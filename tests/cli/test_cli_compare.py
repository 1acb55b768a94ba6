"""kvbench compare A B: the gate outside pytest, with exit code 1 on a regression."""

import json

import pytest
from test_cli_support import (
    ENVIRONMENT,
    OTHER_ID,
    RUN_ID,
    assert_usage_error,
    make_record,
    make_samples,
    run_cli,
    standard_records,
    typed,
    write_run,
)

from pytest_kvbench.comparison.baseline_file import write_baseline

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

GOOD = [1, 1, 0, 1, 1, 0.5, 1, 0, 1, 1, 1, 0, 1, 1, 0.5, 1, 1, 1, 0, 1] * 3


def two_runs(tmp_path, current_scores, *, current_kwargs=None):
    write_run(tmp_path, [make_record(GOOD), make_record(GOOD, task="hotpotqa")])
    write_run(tmp_path, [make_record(current_scores, **(current_kwargs or {})), make_record(GOOD, task="hotpotqa")],
              run_id=OTHER_ID)


def test_identical_runs_pass(capsys, tmp_path):
    two_runs(tmp_path, GOOD)
    code, out, _ = run_cli(capsys, "compare", RUN_ID, OTHER_ID, "--results", tmp_path)
    assert code == 0
    assert "kvbench compare: 2 ok" in out and "REGRESSION" not in out


def test_a_broken_method_fails_with_exit_code_1(capsys, tmp_path):
    broken = [0.0 if i % 3 else s for i, s in enumerate(GOOD)]
    two_runs(tmp_path, broken)
    code, out, _ = run_cli(capsys, "compare", RUN_ID, OTHER_ID, "--results", tmp_path)
    assert code == 1
    assert "1 ok, 1 regression" in out
    line = next(line for line in out.splitlines() if line.startswith("REGRESSION"))
    assert "default|snapkv|128|qasper|seed0" in line and "95% CI" in line and "p=" in line
    for column in ("baseline", "current", "delta", "95% CI", "p (t-test)", "verdict"):
        assert column in out


def test_noise_passes(capsys, tmp_path):
    noisy = list(GOOD)
    noisy[0], noisy[2] = 0, 1  # one answer lost, another gained
    noisy[3] = 0
    two_runs(tmp_path, noisy)
    code, out, _ = run_cli(capsys, "compare", RUN_ID, OTHER_ID, "--results", tmp_path)
    assert code == 0 and "regression" not in out.split("kvbench compare:")[1]


def test_mismatch_is_reported_and_fails_only_with_strict(capsys, tmp_path):
    two_runs(tmp_path, None, current_kwargs={"samples": make_samples([1, 0, 1], prefix="other")})
    code, out, _ = run_cli(capsys, "compare", RUN_ID, OTHER_ID, "--results", tmp_path)
    assert code == 0
    assert "mismatch default|snapkv|128|qasper|seed0: sample ids differ" in out
    code, _, _ = run_cli(capsys, "compare", RUN_ID, OTHER_ID, "--strict", "--results", tmp_path)
    assert code == 1


def test_new_and_unrun_items_are_listed(capsys, tmp_path):
    write_run(tmp_path, [make_record(GOOD), make_record(GOOD, task="hotpotqa")])
    write_run(tmp_path, [make_record(GOOD), make_record(GOOD, task="narrativeqa")], run_id=OTHER_ID)
    code, out, _ = run_cli(capsys, "compare", RUN_ID, OTHER_ID, "--results", tmp_path)
    assert code == 0
    assert "1 ok, 1 new, 1 baseline entry not run" in out
    assert "not run: default|snapkv|128|hotpotqa|seed0" in out


def test_seeds_pair_up_by_key(capsys, tmp_path):
    write_run(tmp_path, standard_records(seeds=(0, 1)))
    write_run(tmp_path, standard_records(run_id=OTHER_ID, seeds=(0, 1)), run_id=OTHER_ID)
    code, out, _ = run_cli(capsys, "compare", RUN_ID, OTHER_ID, "--results", tmp_path)
    assert code == 0 and "kvbench compare: 20 ok" in out


def test_a_saved_baseline_file_can_be_the_reference(capsys, tmp_path):
    write_baseline(tmp_path / "baseline.json", [typed(make_record(GOOD))], ENVIRONMENT, force=False)
    write_run(tmp_path, [make_record([0] * len(GOOD))], run_id=OTHER_ID)
    code, out, _ = run_cli(capsys, "compare", tmp_path / "baseline.json", OTHER_ID, "--results", tmp_path)
    assert code == 1 and f"against baseline file {tmp_path / 'baseline.json'}" in out


def test_latency_gate_on_request(capsys, tmp_path):
    slow = make_samples(GOOD, latency_ms=(80.0, 120.0), prefix="qasper")
    write_run(tmp_path, [make_record(GOOD)])
    write_run(tmp_path, [make_record(samples=slow)], run_id=OTHER_ID)
    assert run_cli(capsys, "compare", RUN_ID, OTHER_ID, "--results", tmp_path)[0] == 0
    code, out, _ = run_cli(capsys, "compare", RUN_ID, OTHER_ID, "--fail", "latency:20%", "--results", tmp_path)
    assert code == 1 and "latency baseline" in out


def test_environment_changes_are_shown(capsys, tmp_path):
    write_run(tmp_path, [make_record(GOOD)])
    write_run(tmp_path, [make_record(GOOD)], run_id=OTHER_ID,
              environment=ENVIRONMENT | {"versions": ENVIRONMENT["versions"] | {"torch": "2.14.0"}})
    _, out, _ = run_cli(capsys, "compare", RUN_ID, OTHER_ID, "--results", tmp_path)
    assert "environment changed: torch: 2.13.0 -> 2.14.0" in out


def test_bad_inputs_exit_2_with_one_line(capsys, tmp_path):
    two_runs(tmp_path, GOOD)
    code, _, err = run_cli(capsys, "compare", RUN_ID, OTHER_ID, "--fail", "speed:3", "--results", tmp_path)
    assert_usage_error(code, err, "invalid tolerance 'speed:3'")
    code, _, err = run_cli(capsys, "compare", RUN_ID, "bench_nothere", "--results", tmp_path)
    assert_usage_error(code, err, "no run 'bench_nothere'")
    broken = tmp_path / "baseline.json"
    broken.write_text(json.dumps({"format": "kvbench-baseline", "version": 1, "entries": {"k": {"score": None}}}))
    code, _, err = run_cli(capsys, "compare", broken, OTHER_ID, "--results", tmp_path)
    assert_usage_error(code, err, str(broken), "entry 'k' has no numeric 'score'")
