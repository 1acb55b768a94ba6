"""`kvbench coverage RUN BASELINE` (pytest_kvbench/comparison/gate_coverage.py): a CI gate fails when its baseline's
entries were not compared (a renamed model or task turns every item into a "new" one, which the gate itself
reports without failing)."""

from __future__ import annotations

import pytest

from pytest_kvbench.comparison.baseline_file import write_baseline
from tests.test_cli_support import make_record, run_cli, typed_all, write_run

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


def gated(record: dict, status: str) -> dict:
    return dict(record, verdict={"key": record["key"], "status": status})


def test_every_baseline_entry_judged_passes_and_new_items_do_not_count(tmp_path, capsys):
    baseline = tmp_path / "baseline.json"
    kept = [make_record(method="snapkv"), make_record(method="h2o")]
    write_baseline(baseline, typed_all(kept), {}, force=False)
    write_run(tmp_path / "ok", [gated(kept[0], "ok"), gated(kept[1], "regression")])
    assert run_cli(capsys, "coverage", "--results", tmp_path / "ok", "latest", baseline) == (
        0, "all 2 baseline entries compared\n", "")
    renamed = [gated(make_record(method="snapkv", model="other"), "new"), gated(kept[1], "new")]
    write_run(tmp_path / "renamed", renamed)
    code, out, err = run_cli(capsys, "coverage", "--results", tmp_path / "renamed", "latest", baseline)
    assert (code, out) == (1, "")
    assert err.startswith("2 of 2 baseline entries were not compared") and err.count("\n") == 1
    assert kept[0]["key"] in err and kept[1]["key"] in err


def test_one_entry_left_uncompared_fails(tmp_path, capsys):
    baseline = tmp_path / "baseline.json"
    kept = [make_record(method="snapkv"), make_record(method="h2o")]
    write_baseline(baseline, typed_all(kept), {}, force=False)
    write_run(tmp_path / "half", [gated(kept[0], "ok")])
    code, _, err = run_cli(capsys, "coverage", "--results", tmp_path / "half", "latest", baseline)
    assert code == 1 and err.startswith("1 of 2 baseline entries") and kept[1]["key"] in err


def test_a_missing_run_or_baseline_is_one_line_and_exit_2(tmp_path, capsys):
    baseline = tmp_path / "baseline.json"
    write_baseline(baseline, typed_all([make_record()]), {}, force=False)
    code, out, err = run_cli(capsys, "coverage", "--results", tmp_path / "nothing", "latest", baseline)
    assert (code, out) == (2, "") and err.startswith("kvbench coverage: error: ") and err.count("\n") == 1
    write_run(tmp_path / "ok", [gated(make_record(), "ok")])
    code, out, err = run_cli(capsys, "coverage", "--results", tmp_path / "ok", "latest", tmp_path / "none.json")
    assert (code, out) == (2, "") and err.startswith("kvbench coverage: error: ") and err.count("\n") == 1
