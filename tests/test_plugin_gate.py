"""The regression gate end to end: save a baseline, rerun identically, rerun with a broken method."""

import json

import pytest

from helpers import run_bench

GRID = ["--kvbench-methods", "snapkv", "--kvbench-budgets", "64", "--kvbench-tasks", "niah_single_1",
        "--kvbench-context-lengths", "512", "--kvbench-samples", "12"]

@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    base = tmp_path_factory.mktemp("gate")
    path = base / "baseline.json"
    proc = run_bench(base / "save", *GRID, "--kvbench-results", str(base / "r0"), "--kvbench-save", str(path))
    assert proc.returncode == 0, proc.stdout[-2000:]
    return base, path


def test_the_saved_baseline_holds_per_sample_scores(baseline):
    _, path = baseline
    data = json.loads(path.read_text())
    (entry,) = data["entries"].values()
    assert len(entry["samples"]) == 12
    assert {"id", "score"} <= set(entry["samples"][0])
    assert entry["method"]["params"]["window"] == 32


def test_an_identical_rerun_is_not_flagged(baseline):
    base, path = baseline
    proc = run_bench(base / "same", *GRID, "--kvbench-results", str(base / "r1"), "--kvbench-compare", str(path))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "comparison with baseline" in proc.stdout


def test_a_significant_drop_fails_the_item_with_the_figures(baseline):
    """A baseline in which every sample was right: the current run's scores are a significant drop."""
    base, path = baseline
    data = json.loads(path.read_text())
    (entry,) = data["entries"].values()
    current = entry["score"]
    for sample in entry["samples"]:
        sample["score"] = 1.0
    entry["score"] = 100.0
    better = base / "better.json"
    better.write_text(json.dumps(data))
    proc = run_bench(base / "worse", *GRID, "--kvbench-results", str(base / "r2"), "--kvbench-compare", str(better))
    assert proc.returncode == 1
    assert "regression against the baseline" in proc.stdout
    assert "95% CI" in proc.stdout and "100.00" in proc.stdout and f"{current:.2f}" in proc.stdout
    loose = run_bench(base / "loose", *GRID, "--kvbench-results", str(base / "r3"), "--kvbench-compare", str(better),
                      "--kvbench-compare-fail", "score:100")
    assert loose.returncode == 0, "a drop within the tolerance is not a failure"


def test_saving_over_an_existing_baseline_needs_force(baseline):
    base, path = baseline
    proc = run_bench(base / "again", *GRID, "--kvbench-results", str(base / "r4"), "--kvbench-save", str(path))
    assert proc.returncode == 4 and "--kvbench-save-force" in proc.stderr


def test_a_malformed_baseline_is_a_usage_error_before_anything_runs(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{ nope")
    proc = run_bench(tmp_path / "w", *GRID, "--kvbench-compare", str(bad), "--kvbench-results", str(tmp_path / "r"))
    assert proc.returncode == 4
    assert "bad.json" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()
