"""The regression gate end to end: save a baseline, rerun identically, rerun with a broken method."""

import json

import pytest

from helpers import run_bench

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

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
    assert entry["score"] >= 50, "the embedded model retrieves with snapkv at this budget"


def test_an_identical_rerun_is_not_flagged(baseline):
    base, path = baseline
    proc = run_bench(base / "same", *GRID, "--kvbench-results", str(base / "r1"), "--kvbench-compare", str(path))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "comparison with baseline" in proc.stdout
    assert "gate power (what each baseline entry can detect)" in proc.stdout and "points" in proc.stdout


BROKEN_SNAPKV = """
import torch
import kvmethods.scorers.snapkv


def random_positions(self, layer, n_keep):
    # SnapKV's name, random selection: the silent breakage the gate exists to catch
    generator = torch.Generator().manual_seed(layer.layer_idx)
    return torch.rand(layer.keys.shape[:3], generator=generator)


kvmethods.scorers.snapkv.SnapKV.score = random_positions
"""


def test_a_broken_method_under_a_good_name_is_caught(baseline):
    base, path = baseline
    work = base / "broken"
    work.mkdir()
    (work / "conftest.py").write_text(BROKEN_SNAPKV)
    proc = run_bench(work, *GRID, "--kvbench-results", str(base / "r2"), "--kvbench-compare", str(path))
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "regression against the baseline" in proc.stdout
    assert "95% CI" in proc.stdout
    assert "kl higher (further from the full cache)" in proc.stdout and "--kvbench-save" in proc.stdout
    loose = run_bench(work, *GRID, "--kvbench-results", str(base / "r3"), "--kvbench-compare", str(path),
                      "--kvbench-compare-fail", "score:100,kl:off,agreement:off,decode_kl:off")
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


def test_a_baseline_from_before_a_prompt_change_fails_as_a_changed_benchmark(baseline):
    """The engine's fingerprint reaches the baseline; a prompt that changed since (here: the baseline's digests of
    two samples as an older prompt template left them) fails with what changed, not with a score verdict."""
    base, path = baseline
    data = json.loads(path.read_text())
    (entry,) = data["entries"].values()
    assert entry["benchmark"]["task_version"] == 1 and entry["benchmark"]["metric"] == "string_match_all"
    assert all(len(sample["prompt_digest"]) == 16 and sample["output_digest"] for sample in entry["samples"])
    for sample in entry["samples"][:2]:
        sample["prompt_digest"] = "0" * 16
    older = base / "before-the-prompt-change.json"
    older.write_text(json.dumps(data))
    proc = run_bench(base / "prompt", *GRID, "--kvbench-results", str(base / "r5"), "--kvbench-compare", str(older))
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "benchmark changed: prompt of niah_single_1 (2 of 12 samples' prompt tokens differ)" in proc.stdout
    assert "--kvbench-save" in proc.stdout
