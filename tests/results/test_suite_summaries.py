"""Per-suite summaries: LongBench v2's difficulty and length splits, InfiniteBench's paper columns
and average, in RESULTS.md and in the LaTeX export."""

from dataclasses import replace

import pytest

from pytest_kvbench.results.views.table_formats import to_latex
from pytest_kvbench.results.record import Record
from pytest_kvbench.results.views.tables import results_markdown
from pytest_kvbench.results.views.suite_summaries import suite_summaries

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


def record(method, budget, task, suite, score, splits=None, seed=0):
    item = f"{method}-{task}" if budget == "full" else f"{method}-{budget}-{task}"
    return Record.from_json({
        "item_id": item, "key": f"m|{method}|{budget}|{task}|seed{seed}", "status": "passed", "score": score,
        "model": {"name": "m"}, "method": {"name": method, "params": {}}, "budget": {"spec": budget},
        "task": {"name": task, "suite": suite, "context_length": None}, "fidelity": {"kl": 0.1, "agreement": 0.5},
        "memory": {"kv_bytes_after": 2**20}, "samples": [],
        "aggregate": {"score": score} | ({"splits": splits} if splits else {}),
    })


def splits(overall, easy, hard, short, medium, long):
    return {"overall": overall, "easy": easy, "hard": hard, "short": short, "medium": medium, "long": long}


RECORDS = [
    record("full", "full", "longbench_v2", "longbench_v2", 40.0, splits(40.0, 60.0, 30.0, 50.0, 40.0, 20.0)),
    record("snapkv", "128", "longbench_v2", "longbench_v2", 30.0, splits(30.0, 50.0, 20.0, 40.0, 30.0, 10.0)),
    record("snapkv", "128", "longbench_v2", "longbench_v2", 34.0, splits(34.0, 54.0, 24.0, 40.0, 34.0, 30.0), seed=1),
    record("h2o", "128", "longbench_v2", "longbench_v2", 20.0, splits(20.0, 40.0, 10.0, 30.0, 20.0, 0.0)),
    record("full", "full", "passkey", "infinitebench", 100.0),
    record("full", "full", "longbook_sum_eng", "infinitebench", 20.0),
    record("snapkv", "128", "passkey", "infinitebench", 90.0),
    record("snapkv", "128", "longbook_sum_eng", "infinitebench", 18.0),
    record("h2o", "128", "passkey", "infinitebench", 50.0),
    record("full", "full", "qasper", "longbench", 40.0),
]


def cells_of(records):
    cells = {}
    for r in records:
        method = r.item_id.split("-")[0]
        cells.setdefault(method, {}).setdefault(r.task.name, []).append(r)
    return cells


def test_longbench_v2_splits_averaged_over_seeds():
    lbv2, infinite = suite_summaries(cells_of(RECORDS))
    assert lbv2.title == "LongBench v2 (longbench_v2)"
    assert lbv2.columns == ["Overall", "Easy", "Hard", "Short", "Medium", "Long"]
    assert lbv2.values["snapkv"] == {"Overall": 32.0, "Easy": 52.0, "Hard": 22.0, "Short": 40.0, "Medium": 32.0,
                                     "Long": 20.0}
    assert set(lbv2.values) == {"full", "snapkv", "h2o"}


def test_infinitebench_paper_order_names_and_average():
    infinite = suite_summaries(cells_of(RECORDS))[1]
    assert infinite.columns == ["Retrieve.PassKey", "En.Sum", "Avg"]  # the paper's order, not the run's
    assert infinite.values["snapkv"] == {"Retrieve.PassKey": 90.0, "En.Sum": 18.0, "Avg": 54.0}
    assert infinite.values["h2o"]["Avg"] is None  # En.Sum did not run for h2o: no average
    assert "qasper" not in str(infinite.values)


def test_no_summary_without_those_suites():
    assert suite_summaries(cells_of([r for r in RECORDS if r.task.suite == "longbench"])) == []


def test_results_markdown_has_the_summaries_under_each_budget():
    text = results_markdown({"run_id": "r"}, RECORDS)
    assert "## m — budget 128 — LongBench v2 (longbench_v2)" in text and "## m — budget 128 — InfiniteBench" in text
    row = next(line for line in text.splitlines() if line.startswith("| snapkv") and "52.0" in line)
    assert [c.strip() for c in row.strip("|").split("|")] == ["snapkv", "32.0", "52.0", "22.0", "40.0", "32.0", "20.0"]


def test_latex_prints_each_summary_with_the_best_compressed_value_bold():
    text = to_latex(RECORDS)
    assert "\\caption{LongBench v2 (longbench\\_v2) on m, budget 128 (score x 100).}" in text
    assert "Method & Retrieve.PassKey & En.Sum & Avg \\\\" in text
    assert "snapkv & \\textbf{32.0} & \\textbf{52.0} & \\textbf{22.0} & \\textbf{40.0} & \\textbf{32.0} & \\textbf{20.0} \\\\" in text
    assert "full & 40.0 & 60.0 & 30.0 & 50.0 & 40.0 & 20.0 \\\\" in text  # the reference is never bold


def scbench_record(method, score, turns, seed=0, history="gold"):
    r = record(method, "full" if method == "full" else "128", "scbench_kv", "scbench", score, seed=seed)
    return replace(r, task=replace(r.task, history=history), aggregate=r.aggregate | {"turns": turns})


def test_scbench_reports_each_turn_then_the_pooled_score():
    records = [scbench_record("full", 80.0, {"1": 100.0, "2": 60.0}),
               scbench_record("snapkv", 50.0, {"1": 70.0, "2": 30.0}),
               scbench_record("snapkv", 60.0, {"1": 80.0, "2": 40.0}, seed=1)]
    (summary,) = suite_summaries(cells_of(records))
    assert summary.title == "SCBench scbench_kv by turn (gold history)" and summary.by_turn
    assert summary.columns == ["Turn 1", "Turn 2", "Pooled"]
    assert summary.values["snapkv"] == {"Turn 1": 75.0, "Turn 2": 35.0, "Pooled": 55.0}  # seeds averaged
    assert summary.values["full"] == {"Turn 1": 100.0, "Turn 2": 60.0, "Pooled": 80.0}
