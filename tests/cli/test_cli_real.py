"""Every kvbench verb on run directories made by real benchmark runs (not hand-built ones)."""

import json
import subprocess
import sys

import pytest

from helpers import SMALL_GRID, run_bench

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


def kvbench(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "pytest_kvbench.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def runs(small_run, tmp_path_factory):
    """The shared small run plus a second real run of other methods and two seeds, in one results dir."""
    import shutil

    _, _, shared, _ = small_run
    other = tmp_path_factory.mktemp("other")
    results = other / "res"
    (original,) = (shared / "runs").iterdir()
    first = results / "runs" / original.name
    shutil.copytree(original, first)  # keep the shared run's results dir as it was
    grid = [a if a != "full,streamingllm,snapkv" else "tova,knorm" for a in SMALL_GRID]
    proc = run_bench(other / "work", *grid, "--kvbench-seeds", "0,1", "--kvbench-results", str(results))
    assert proc.returncode == 0, proc.stdout[-2000:]
    second = next(p for p in (results / "runs").iterdir() if p != first)
    return results, first.name, second.name


def test_list_and_show_and_reproduce(runs):
    results, first, second = runs
    listing = kvbench("list", "--results", str(results))
    assert listing.returncode == 0 and first in listing.stdout and second in listing.stdout
    assert "snapkv" in listing.stdout and "niah_single_1" in listing.stdout
    show = kvbench("show", first, "--results", str(results), "--reproduce")
    assert show.returncode == 0
    assert "pytest" in show.stdout and "--kvbench-methods" in show.stdout


@pytest.mark.parametrize("fmt", ["md", "csv", "latex", "json"])
def test_export_formats(runs, fmt):
    results, first, _ = runs
    out = kvbench("export", first, "--format", fmt, "--results", str(results))
    assert out.returncode == 0
    assert "snapkv" in out.stdout
    if fmt == "json":
        json.loads(out.stdout)
    if fmt == "latex":
        assert "\\begin{tabular}" in out.stdout


def test_compare_identical_runs_is_not_a_regression(runs):
    results, first, _ = runs
    out = kvbench("compare", first, first, "--results", str(results))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "regression" not in out.stdout.split("verdict", 1)[-1].lower().replace("no regression", "")


def test_report_merge_and_variance(runs, tmp_path):
    results, first, second = runs
    html = tmp_path / "report.html"
    out = kvbench("report", first, second, "--results", str(results), "--output", str(html))
    assert out.returncode == 0 and html.read_text().lstrip().lower().startswith("<!doctype html")
    merged_dir = tmp_path / "merged"
    out = kvbench("merge", first, second, "--results", str(results), "--into", str(merged_dir))
    assert out.returncode == 0, out.stderr
    (merged,) = (merged_dir / "runs").iterdir()
    records = json.loads((merged / "run.json").read_text())["records"]
    assert len(records) == 6 + 8
    out = kvbench("variance", second, "--results", str(results), "--plot", str(tmp_path / "cv.png"))
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "cv.png").stat().st_size > 0
    out = kvbench("variance", first, "--results", str(results))
    assert out.returncode == 2 and "at least two seeds" in out.stderr


def test_bad_run_ids_and_corrupt_files_exit_2(runs, tmp_path):
    results, first, _ = runs
    out = kvbench("show", "bench_doesnotexist", "--results", str(results))
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stderr.strip().count("\n") == 0
    broken = tmp_path / "runs" / "bench_deadbeef_20260101_000000"
    broken.mkdir(parents=True)
    (broken / "run.json").write_text("{not json")
    out = kvbench("show", broken.name, "--results", str(tmp_path))
    assert out.returncode == 2 and "run.json" in out.stderr and "Traceback" not in out.stderr
