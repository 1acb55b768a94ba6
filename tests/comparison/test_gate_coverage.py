"""pytest_kvbench/comparison/gate_coverage.py: a CI gate fails when its baseline's entries were not compared (a renamed model
or task turns every item into a "new" one, which the gate itself reports without failing)."""

from __future__ import annotations

import pytest

import pytest_kvbench.comparison.gate_coverage as CG
from pytest_kvbench.comparison.baseline_file import write_baseline
from tests.test_cli_support import make_record, typed_all, write_run


def gated(record: dict, status: str) -> dict:
    return dict(record, verdict={"key": record["key"], "status": status})


def test_every_baseline_entry_judged_passes_and_new_items_do_not_count(tmp_path, capsys):
    baseline = tmp_path / "baseline.json"
    kept = [make_record(method="snapkv"), make_record(method="h2o")]
    write_baseline(baseline, typed_all(kept), {}, force=False)
    write_run(tmp_path / "ok", [gated(kept[0], "ok"), gated(kept[1], "regression")])
    assert CG.main([str(tmp_path / "ok"), str(baseline)]) == 0
    renamed = [gated(make_record(method="snapkv", model="other"), "new"), gated(kept[1], "new")]
    write_run(tmp_path / "renamed", renamed)
    assert CG.main([str(tmp_path / "renamed"), str(baseline)]) == 1
    assert "2 of 2 baseline entries were not compared" in capsys.readouterr().err


def test_a_missing_run_is_one_line_and_exit_2(tmp_path, capsys):
    baseline = tmp_path / "baseline.json"
    write_baseline(baseline, typed_all([make_record()]), {}, force=False)
    with pytest.raises(SystemExit) as exit_info:
        CG.main([str(tmp_path / "nothing"), str(baseline)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("check_gate_coverage: ") and err.count("\n") == 1
