"""kvbench report: one self-contained HTML page whose plots a real browser renders."""

import re
import shutil
import subprocess

import pytest
from test_cli_support import (
    OTHER_ID,
    RUN_ID,
    assert_usage_error,
    make_record,
    make_samples,
    run_cli,
    standard_records,
    write_run,
)

from pytest_kvbench.results.report import build_report
from pytest_kvbench.results.runs import load_run

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
CHROMIUM = next((path for name in CHROMIUM_NAMES if (path := shutil.which(name))), None)


def needle_records(run_id=OTHER_ID):
    """niah_grid items: per-sample depth and context length, as the RULER depth grid records them."""
    records = []
    for method, budget in (("full", "full"), ("snapkv", "128")):
        grid = [(depth, length) for length in (1024, 2048) for depth in (0, 50, 100)]
        scores = [0.0 if (method == "snapkv" and depth == 50) else 1.0 for depth, length in grid]
        samples = make_samples(scores, prefix="niah", fields=[{"depth": d, "context_length": n} for d, n in grid])
        records.append(make_record(samples=samples, method=method, budget=budget, task="niah_grid", suite="ruler",
                                   metric="recall", params={} if method == "full" else None, run_id=run_id))
    return records


@pytest.fixture
def results(tmp_path):
    write_run(tmp_path, standard_records())
    write_run(tmp_path, needle_records(), run_id=OTHER_ID)
    return tmp_path


def plots_in(page):
    return re.findall(r'<figure class="plot" data-plot="([^"]+)"><svg', page)


def test_report_has_every_plot_inline_and_nothing_external(capsys, results):
    target = results / "report.html"
    code, out, _ = run_cli(capsys, "report", RUN_ID, OTHER_ID, "--output", target, "--results", results)
    assert code == 0 and f"wrote {target}" in out
    page = target.read_text()
    assert plots_in(page) == ["budget-tokens", "memory", "heatmap", "needle-0", "needle-1"]
    assert not re.search(r'(src|href)="(https?:)?//', page), "a self-contained page fetches nothing"
    assert "<link" not in page
    for section in ("Scores", "Score against budget", "Score against KV memory", "Task x method",
                    "Needle in a haystack", "Environment"):
        assert f"<h2>{section}</h2>" in page
    assert "<strong>65.62</strong>" in page  # best compressed score in bold, as in the tables
    assert RUN_ID in page and OTHER_ID in page


def test_plots_carry_the_data(results):
    page = build_report([load_run(RUN_ID, results), load_run(OTHER_ID, results)])
    heatmap = page.split('data-plot="heatmap"')[1].split("</figure>")[0]
    for text in ("qasper", "hotpotqa", "niah_grid", "snapkv @128", "streamingllm @512", "62.5"):
        assert text in heatmap
    needle = page.split('data-plot="needle-1"')[1].split("</figure>")[0]
    assert "niah_grid — snapkv @ 128" in needle and "needle depth" in needle and "2048" in needle
    budget = page.split('data-plot="budget-tokens"')[1].split("</figure>")[0]
    assert "full (no compression)" in budget and "streamingllm" in budget


def test_ratio_budgets_get_their_own_plot(tmp_path):
    write_run(tmp_path, [make_record(budget="r0.5"), make_record(budget="r0.75"), make_record(method="h2o", params={},
                                                                                                budget="r0.5")])
    page = build_report([load_run(RUN_ID, tmp_path)])
    assert plots_in(page)[:1] == ["budget-ratio"] and "needle" not in " ".join(plots_in(page))


def test_same_items_in_two_runs_are_told_apart(tmp_path):
    write_run(tmp_path, [make_record([1, 1])])
    write_run(tmp_path, [make_record([0, 1])], run_id=OTHER_ID)
    page = build_report([load_run(RUN_ID, tmp_path), load_run(OTHER_ID, tmp_path)])
    assert "snapkv [0a1b2c3d]" in page and "snapkv [9f8e7d6c]" in page


def test_text_from_records_is_escaped(tmp_path):
    write_run(tmp_path, [make_record(task="<script>alert(1)</script>")])
    page = build_report([load_run(RUN_ID, tmp_path)])
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;" in page


def test_reporting_nothing_or_a_bad_run_is_exit_2(capsys, tmp_path):
    write_run(tmp_path, [make_record(status="error")])
    code, _, err = run_cli(capsys, "report", RUN_ID, "--output", tmp_path / "r.html", "--results", tmp_path)
    assert_usage_error(code, err, "nothing to report")
    assert not (tmp_path / "r.html").exists()
    code, _, err = run_cli(capsys, "report", "bench_zz", "--output", tmp_path / "r.html", "--results", tmp_path)
    assert_usage_error(code, err, "no run 'bench_zz'")


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary; install with: apt-get install -y chromium")
def test_a_headless_browser_renders_every_plot(results, tmp_path):
    target = results / "report.html"
    assert run_cli_quiet("report", RUN_ID, OTHER_ID, "--output", target, "--results", results) == 0
    profile = tmp_path / "chromium-profile"
    completed = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
         "--dump-dom",
         target.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )
    dom = completed.stdout
    assert completed.returncode == 0, completed.stderr[-2000:]
    status = re.search(r'<p id="render-status" data-plots="(\d+)" data-rendered="(\d+)">', dom)
    assert status, "the page's check script did not run"
    assert status.groups() == ("5", "5")
    assert dom.count('data-rendered="yes"') == 5


def run_cli_quiet(*argv):
    from pytest_kvbench.cli import main

    return main([str(a) for a in argv])
