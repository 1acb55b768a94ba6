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
    typed,
    write_run,
)

from pytest_kvbench.results.report.html_report import build_report
from pytest_kvbench.results.run.directories import load_run

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

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
    assert plots_in(page) == ["budget-tokens", "fidelity", "memory", "heatmap", "needle-0", "needle-1"]
    assert not re.search(r'(src|href)="(https?:)?//', page), "a self-contained page fetches nothing"
    assert "<link" not in page
    for section in ("Scores", "Score against budget", "Fidelity to the full cache", "Score against KV memory",
                    "Task x method", "Needle in a haystack", "Environment"):
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


def test_score_bands_are_the_samples_bootstrap_interval_or_the_seeds_t_interval():
    from pytest_kvbench.results.report.budget_figures import score_interval

    one_run = typed(make_record([1, 0, 1, 1, 0, 1, 1, 0]))
    mean, low, high = score_interval([one_run])
    assert mean == 62.5 and 20 < low < mean < high < 100
    assert score_interval([typed(make_record([1, 1, 1, 1]))])[1:] == (100.0, 100.0)  # no spread among the samples
    seeds = [typed(make_record(scores, seed=seed)) for seed, scores in enumerate(([1, 0, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]))]
    mean, low, high = score_interval(seeds)
    assert mean == 75.0 and low < 50 and high > 100  # three seeds: a wide Student-t interval


def test_the_budget_plot_draws_a_band_and_the_fidelity_plot_both_metrics(results):
    page = build_report([load_run(RUN_ID, results)])
    budget = page.split('data-plot="budget-tokens"')[1].split("</figure>")[0]
    assert "fill-opacity: 0.15" in budget and "band: 95% CI" in budget
    fidelity = page.split('data-plot="fidelity"')[1].split("</figure>")[0]
    assert "KL(full || method)" in fidelity and "agreement" in fidelity and "snapkv" in fidelity


def test_a_task_whose_full_cache_scores_0_is_one_line_not_a_plot(tmp_path):
    records = standard_records() + [make_record([0, 0, 0, 0], method=method, budget=budget, task="passkey",
                                                suite="infinitebench", params={} if method == "full" else None)
                                    for method, budget in (("full", "full"), ("snapkv", "128"), ("snapkv", "512"))]
    write_run(tmp_path, records)
    page = build_report([load_run(RUN_ID, tmp_path)])
    line = re.search(r'<p class="note" id="no-signal">([^<]*)</p>', page)
    assert line and "Full cache scores 0 on passkey" in line.group(1)
    for plot in plots_in(page):
        assert "passkey" not in page.split(f'data-plot="{plot}"')[1].split("</figure>")[0], plot
    assert "passkey" in page.split("<h2>Scores</h2>")[1].split("</section>")[0]  # still in the tables
    assert 'id="no-signal"' not in build_report([load_run(RUN_ID, write_run(tmp_path / "b", standard_records()).parents[1])])


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


LAPTOP_WIDTH = 1280


def browser_status(page, tmp_path) -> dict:
    """The page's own check (render-status: plots rendered, elements wider than the page) as a headless
    chromium with a laptop's window width leaves it."""
    profile = tmp_path / "chromium-profile"
    completed = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
         "--hide-scrollbars", f"--window-size={LAPTOP_WIDTH},900", "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    status = re.search(r'<p id="render-status"([^>]*)>([^<]*)', completed.stdout)
    assert status, "the page's check script did not run"
    attributes = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', status.group(1)))
    return attributes | {"text": status.group(2), "rendered-figures": completed.stdout.count('data-rendered="yes"')}


needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary; install with: apt-get install -y chromium")


@needs_chromium
def test_a_headless_browser_renders_every_plot(results, tmp_path):
    target = results / "report.html"
    assert run_cli_quiet("report", RUN_ID, OTHER_ID, "--output", target, "--results", results) == 0
    status = browser_status(target, tmp_path)
    assert (status["plots"], status["rendered"], status["rendered-figures"]) == ("6", "6", 6)
    assert status["overflow"] == "0", status["text"]


@needs_chromium
def test_a_wide_grid_fits_a_laptop_screen(tmp_path):
    """Many long task names make a score table far wider than 1,280 px, and a long command a wide cell:
    the table scrolls inside its box, the command wraps, nothing runs off the page."""
    tasks = [f"a_rather_long_task_name_{i:02d}" for i in range(16)]
    records = [make_record([1, 0, 1, 1], method=method, budget=budget, task=task, params={} if method == "full" else None)
               for task in tasks for method, budget in (("full", "full"), ("snapkv", "128"))]
    environment = {"command": "pytest bench/ " + " ".join(f"--kvbench-option-{i}=value" for i in range(40)),
                   "path": "/very/long/" + "x" * 400}
    write_run(tmp_path, records, environment=environment)
    target = tmp_path / "wide.html"
    assert run_cli_quiet("report", RUN_ID, "--output", target, "--results", tmp_path) == 0
    page = target.read_text()
    assert page.count('<div class="table-box">') >= 2
    status = browser_status(target, tmp_path)
    assert status["overflow"] == "0", status["text"]
    assert int(status["page-width"]) <= LAPTOP_WIDTH and status["viewport-width"] == str(LAPTOP_WIDTH)


def run_cli_quiet(*argv):
    from pytest_kvbench.cli import main

    return main([str(a) for a in argv])
