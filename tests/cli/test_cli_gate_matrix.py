"""`kvbench coverage` without a run (pytest_kvbench/comparison/product_coverage.py): the matrix of what the gates'
baseline files cover, method x budget kind x protocol, and exit 1 when a built-in method, a budget kind or a
protocol has no gate entry that can fail (issue 50 part 2: bugs in methods no gate ran went through)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvmethods.core.catalog import BUILTINS, PROTOCOLS
from pytest_kvbench.comparison.baseline_file import write_baseline
from pytest_kvbench.comparison.product_coverage import NOT_GATED
from tests.test_cli_support import make_record, run_cli, typed_all

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

ROOT = Path(__file__).resolve().parents[2]
POWERFUL = (1, 1, 1, 1, 1, 1, 1, 0)  # eight samples, seven answers: losing them is a significant drop


def entry(method: str, budget: str = "128", protocol: str = "question_in_window", scores=POWERFUL) -> dict:
    record = make_record(scores, method=method, budget="full" if method == "full" else "128", protocol=protocol)
    if budget.startswith("m"):
        record["budget"] = {"spec": budget, "kind": "memory", "value": float(budget[1:])}
    elif budget.startswith("r"):
        record["budget"] = {"spec": budget, "kind": "ratio", "value": float(budget[1:])}
    record["key"] = record["key"].replace("|128|", f"|{budget}|") + (
        "" if protocol == "question_in_window" else f"|protocol={protocol}")
    return record


def full_product(leave_out: str = "") -> list[dict]:
    """One powerful entry per gated built-in, every budget kind and protocol among them."""
    records = [entry(m) for m in sorted(BUILTINS) if m not in (leave_out, *NOT_GATED)]
    records += [entry("snapkv", "r0.9"), entry("kivi", "m0.125")]
    records += [entry("snapkv", protocol=p) for p in PROTOCOLS[1:]]
    return records


def gates(tmp_path: Path, *named: tuple[str, list[dict]]) -> list[str]:
    args = []
    for name, records in named:
        path = tmp_path / f"baseline-{name}.json"
        write_baseline(path, typed_all(records), {}, force=True)
        args += ["--baseline", path]
    return args


def test_every_method_budget_kind_and_protocol_covered_passes(tmp_path, capsys):
    code, out, err = run_cli(capsys, "coverage", *gates(tmp_path, ("smoke", full_product())))
    assert code == 0 and err == "", err
    assert "covered by a gate entry that can fail" in out
    row = next(line for line in out.splitlines() if line.startswith("| snapkv ") and "shared_context" in line)
    assert "smoke: score -" in row and "UNCOVERED" not in out
    assert all(f"not gated: {name}:" in out for name in NOT_GATED)


def test_a_builtin_method_without_an_entry_fails_naming_it(tmp_path, capsys):
    code, out, err = run_cli(capsys, "coverage", *gates(tmp_path, ("smoke", full_product(leave_out="keydiff"))))
    assert code == 1
    assert err == "not covered by any gate entry that can fail: methods: keydiff\n"
    assert next(line for line in out.splitlines() if line.startswith("| keydiff ")).count("UNCOVERED") == 1


def test_an_entry_that_cannot_fail_does_not_cover(tmp_path, capsys):
    """keydiff runs, but scores 0 on every sample and its output is the full cache's: only an error fails it."""
    blind = entry("keydiff", scores=(0,) * 8)
    for sample in blind["samples"]:
        sample["kl"], sample["agreement"] = 0.0, 1.0
    records = full_product(leave_out="keydiff") + [blind]
    code, out, err = run_cli(capsys, "coverage", *gates(tmp_path, ("smoke", records)))
    assert code == 1 and "methods: keydiff" in err
    assert "scores 0 on every sample; output equal to the full cache's" in next(line for line in out.splitlines() if line.startswith("| keydiff "))


def test_budget_kinds_and_protocols_are_gaps_too_and_gates_add_up(tmp_path, capsys):
    product = full_product()
    no_ratio = [r for r in product if r["budget"]["kind"] != "ratio" and "multi_turn" not in r["key"]]
    code, _, err = run_cli(capsys, "coverage", *gates(tmp_path, ("smoke", no_ratio)))
    assert code == 1 and err == ("not covered by any gate entry that can fail: budget kinds: ratio rX; "
                                 "protocols: multi_turn\n")
    rest = [r for r in product if r not in no_ratio]
    code, out, _ = run_cli(capsys, "coverage", "--json", *gates(tmp_path, ("smoke", no_ratio), ("real", rest)))
    report = json.loads(out)
    assert code == 0 and report["uncovered"] == {"methods": [], "budget_kinds": [], "protocols": []}
    ratio = next(c for c in report["cells"] if c["budget_kind"] == "ratio")
    assert (ratio["gate"], ratio["method"], ratio["samples"], ratio["can_fail"]) == ("real", "snapkv", 8, True)
    assert ratio["score_drop"] > 0 and report["not_gated"] == NOT_GATED


def test_default_reads_every_baseline_of_the_results_directory(tmp_path, capsys):
    gates(tmp_path, ("smoke", full_product()))
    code, out, _ = run_cli(capsys, "coverage", "--results", tmp_path)
    assert code == 0 and "smoke (" in out
    code, out, err = run_cli(capsys, "coverage", "--results", tmp_path / "empty")
    assert (code, out) == (2, "") and err.count("\n") == 1


def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys):
    for argv in (["coverage", "latest"], ["coverage", "--baseline", tmp_path / "none.json"],
                 ["coverage", "latest", "b.json", "--json"]):
        code, out, err = run_cli(capsys, *argv)
        assert (code, out) == (2, "") and err.startswith("kvbench coverage: error: ") and err.count("\n") == 1, argv


def test_a_blank_baseline_names_the_option_typed(capsys):
    code, out, err = run_cli(capsys, "coverage", "--baseline", "")
    assert (code, out) == (2, "") and "--baseline is empty" in err and "gate-baselines" not in err


def test_the_matrix_imports_no_torch():
    code = ("import sys; from pytest_kvbench.cli import main; code = main(['coverage']); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch imported'; "
            "sys.exit(code)")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode in (0, 1) and "torch imported" not in result.stderr, result.stderr
