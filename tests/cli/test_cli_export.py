"""kvbench export (md, csv, latex, json) and kvbench variance."""

import csv
import io
import json
import re

import pytest
from test_cli_support import (
    OTHER_ID,
    RUN_ID,
    assert_usage_error,
    make_record,
    run_cli,
    standard_records,
    typed,
    typed_all,
    write_run,
)

from pytest_kvbench.results.views.table_formats import score_tables, to_latex, to_markdown

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


@pytest.fixture
def results(tmp_path):
    write_run(tmp_path, standard_records())
    return tmp_path


def test_markdown_has_one_table_per_budget_with_full_first_and_best_in_bold(capsys, results):
    code, out, _ = run_cli(capsys, "export", RUN_ID, "--format", "md", "--results", results)
    assert code == 0
    section = out.split("## default — budget 128")[1].split("## ")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "Method" not in line]
    assert rows[0].startswith("| full")
    snapkv = next(r for r in rows if r.startswith("| snapkv"))
    streaming = next(r for r in rows if r.startswith("| streamingllm"))
    # at 128 snapkv loses one answer per task, streamingllm two: snapkv is best in every column
    assert snapkv.count("**") == 2 * 3 and "**" not in streaming
    assert [c.strip() for c in snapkv.split("|")[2:5]] == ["**65.62**", "**50.00**", "**57.81**"]  # hotpotqa, qasper, Avg


def test_no_bold_when_every_compressed_method_ties():
    records = [make_record([0, 0], method=m, params={}) for m in ("snapkv", "h2o", "tova")]
    assert "**" not in to_markdown(typed_all(records))


def test_csv_is_tidy_one_row_per_record(capsys, results):
    code, out, _ = run_cli(capsys, "export", RUN_ID, "--format", "csv", "--results", results)
    rows = list(csv.DictReader(io.StringIO(out)))
    assert code == 0 and len(rows) == 10
    row = next(r for r in rows if r["method"] == "snapkv" and r["budget"] == "512" and r["task"] == "hotpotqa")
    assert json.loads(row["method_params"]) == {"kernel": 5, "window": 32}
    assert float(row["score"]) == 71.88 and row["kv_bytes_after"] == str(512 * 8000) and row["seed"] == "0"


def test_latex_is_paper_ready_with_bold_best_and_escaping(capsys, results):
    code, out, _ = run_cli(capsys, "export", RUN_ID, "--format", "latex", "--results", results)
    assert code == 0
    assert "\\begin{tabular}{llrrr}" in out and "\\toprule" in out and "\\bottomrule" in out
    assert "Budget & Method & hotpotqa & qasper & Avg \\\\" in out
    rows = [line for line in out.splitlines() if line.endswith("\\\\") and "Method" not in line]
    assert rows == [
        "-- & full & 71.88 & 62.50 & 67.19 \\\\",  # the reference once, not per budget
        "128 & snapkv & \\textbf{65.62} & \\textbf{50.00} & \\textbf{57.81} \\\\",
        " & streamingllm & 53.12 & 37.50 & 45.31 \\\\",
        "512 & snapkv & \\textbf{71.88} & \\textbf{62.50} & \\textbf{67.19} \\\\",
        " & streamingllm & 65.62 & 50.00 & 57.81 \\\\",
    ]
    assert out.count("\\begin{table}") == 1 and out.count("\\midrule") == 3


def test_latex_escapes_special_characters_in_names():
    record = make_record(task="niah_multikey_1", suite="ruler", context_length=4096, method="h2o", params={})
    text = to_latex([typed(record), typed(make_record(task="niah_multikey_1", suite="ruler", context_length=4096))])
    assert "niah\\_multikey\\_1@4096" in text
    assert re.search(r"(?<!\\)_", text.split("\\label")[1].split("\n", 1)[1]) is None


def test_several_seeds_show_mean_and_interval(capsys, tmp_path):
    records = standard_records(seeds=(0, 1, 2))
    for record in records:
        record["score"] += record["seed"]  # seed-to-seed spread
    write_run(tmp_path, records)
    code, out, _ = run_cli(capsys, "export", RUN_ID, "--format", "md", "--results", tmp_path)
    assert code == 0 and "Mean over 3 seeds" in out and "±" in out
    table = next(t for t in score_tables(typed_all(records)) if t.budget == "128")
    assert table.cells[("snapkv", "qasper")].values == [50.0, 51.0, 52.0]
    code, out, _ = run_cli(capsys, "export", RUN_ID, "--format", "latex", "--results", tmp_path)
    assert "$\\pm$" in out


def test_json_export_has_tables_and_records(capsys, results):
    code, out, _ = run_cli(capsys, "export", RUN_ID, "--format", "json", "--results", results)
    data = json.loads(out)
    assert code == 0 and data["run_id"] == RUN_ID and len(data["records"]) == 10
    table = next(t for t in data["tables"] if t["budget"] == "512")
    snapkv = next(r for r in table["rows"] if r["method"] == "snapkv")
    assert snapkv["cells"]["qasper"]["mean"] == 62.5 and snapkv["cells"]["qasper"]["low"] is None
    assert "Avg" in snapkv["best"]


def test_export_to_a_file(capsys, results, tmp_path):
    target = tmp_path / "out" / "table.tex"
    target.parent.mkdir()
    code, out, err = run_cli(capsys, "export", RUN_ID, "--format", "latex", "--output", target, "--results", results)
    assert code == 0 and out == "" and f"wrote {target}" in err
    assert target.read_text().startswith("% Generated by kvbench export")


@pytest.mark.parametrize("layout, name", [("md", "x.md"), ("kvpress", "x")])
def test_export_under_a_missing_folder_is_refused_and_makes_no_folder(capsys, results, tmp_path, layout, name):
    """`--output /nonexistent/dir/x.md` made /nonexistent/dir at the root; only the output itself is made."""
    target = tmp_path / "nowhere" / "dir" / name
    code, out, err = run_cli(capsys, "export", RUN_ID, "--format", layout, "--output", target, "--results", results)
    assert_usage_error(code, err, f"its folder {target.parent} does not exist; create it first")
    assert out == "" and not (tmp_path / "nowhere").exists()


def test_exporting_a_run_without_scores_is_a_clear_error(capsys, tmp_path):
    write_run(tmp_path, [make_record(status="error")])
    code, _, err = run_cli(capsys, "export", RUN_ID, "--format", "md", "--results", tmp_path)
    assert_usage_error(code, err, "nothing to export")


# -- variance -------------------------------------------------------------------------------------


def seeded_records(spread):
    records = []
    for seed, delta in enumerate(spread):
        for record in (make_record([1, 0, 1, 1], seed=seed, show_seed=True),
                       make_record([1, 1, 1, 1], seed=seed, show_seed=True, task="hotpotqa")):
            record["score"] += delta
            records.append(record)
    return records


def test_variance_reports_cv_against_seeds_and_seeds_needed_with_a_plot(capsys, tmp_path):
    write_run(tmp_path, seeded_records([0.0, 1.5, -1.5, 0.5]))
    plot = tmp_path / "variance.png"
    code, out, _ = run_cli(capsys, "variance", RUN_ID, "--threshold", "1%", "--plot", plot, "--results", tmp_path)
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith("default|snapkv|128|qasper"))
    assert "2: " in line and "3: " in line and "4: " in line
    # qasper 75, 76.5, 73.5, 75.5: sd 1.25, cv 1.66%; the mean of k seeds is under 1% from ceil(1.664^2) = 3 seeds
    assert "1.66%" in line and "3 (enough)" in line
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_variance_across_runs_and_a_stricter_threshold(capsys, tmp_path):
    records = seeded_records([0.0, 1.5, -1.5, 0.5])
    write_run(tmp_path, records[:4])
    write_run(tmp_path, records[4:], run_id=OTHER_ID)
    code, out, _ = run_cli(capsys, "variance", RUN_ID, OTHER_ID, "--threshold", "0.005", "--plot", "none",
                           "--results", tmp_path)
    line = next(line for line in out.splitlines() if line.startswith("default|snapkv|128|qasper"))
    assert code == 0 and re.search(r"\b12 \(run 8 more\)", line), line


def test_variance_needs_two_seeds_and_a_valid_threshold(capsys, tmp_path):
    write_run(tmp_path, [make_record()])
    code, _, err = run_cli(capsys, "variance", RUN_ID, "--plot", "none", "--results", tmp_path)
    assert_usage_error(code, err, "at least two seeds")
    write_run(tmp_path, seeded_records([0, 1]), run_id=OTHER_ID)
    code, _, err = run_cli(capsys, "variance", OTHER_ID, "--threshold", "abc", "--results", tmp_path)
    assert_usage_error(code, err, "invalid threshold 'abc'")
    code, _, err = run_cli(capsys, "variance", OTHER_ID, "--plot", tmp_path / "v.docx", "--results", tmp_path)
    assert_usage_error(code, err, "use a .png, .svg or .pdf")
