"""Issue 21 beyond usage errors: repeats make one item, the gate never compares different
settings, and records cannot steer where a run's files are written."""

from __future__ import annotations

import json

import pytest
from helpers import add_bench_files
from test_cli_support import OTHER_ID, RUN_ID, make_record, standard_records, typed, write_run
from test_plugin_grid import collected_ids

from pytest_kvbench.comparison.baseline_file import BaselineEntry
from pytest_kvbench.comparison.tolerances import parse_tolerances
from pytest_kvbench.comparison.verdict_format import comparison_table
from pytest_kvbench.comparison.verdicts import compare_record
from pytest_kvbench.results.run.writer import item_dir
from pytest_kvbench.results.run.merge import merge_runs
from pytest_kvbench.results.record.serializer import from_json
from pytest_kvbench.results.run.directories import RunError, load_run

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

DEFAULT = parse_tolerances([])


# -- one measurement, one item -----------------------------------------------------------------


def test_repeated_values_make_one_item_with_the_canonical_spelling(pytester):
    add_bench_files(pytester)
    result = pytester.runpytest_inprocess(
        "--collect-only", "-q", "-p", "no:cacheprovider",
        "--kvbench-methods", "full,snapkv,snapkv,snapkv:window=32,full", "--kvbench-budgets", "128,0128,r0.50,r0.5",
        "--kvbench-tasks", "passage_retrieval_en,passage_retrieval_en", "--kvbench-seeds", "0,00",
        "--kvbench-model", "default,default")
    assert result.ret == 0, result.stderr.str()
    assert sorted(collected_ids(result)) == ["full-passage_retrieval_en", "snapkv-128-passage_retrieval_en",
                                             "snapkv-r0.5-passage_retrieval_en"]


def test_method_parameters_are_spelled_as_the_method_reads_them(pytester):
    add_bench_files(pytester)
    result = pytester.runpytest_inprocess(
        "--collect-only", "-q", "-p", "no:cacheprovider", "--kvbench-methods", "snapkv:window=064,snapkv:window=64",
        "--kvbench-budgets", "64", "--kvbench-tasks", "passage_retrieval_en")
    assert collected_ids(result) == ["snapkv(window=64)-64-passage_retrieval_en"]


def test_a_composition_in_any_order_is_one_item_spelled_in_role_order(pytester):
    add_bench_files(pytester)
    result = pytester.runpytest_inprocess(
        "--collect-only", "-q", "-p", "no:cacheprovider",
        "--kvbench-methods", "kivi+snapkv,snapkv+kivi,kivi+think,think+kivi,kivi+think+snapkv",
        "--kvbench-budgets", "64", "--kvbench-tasks", "passage_retrieval_en")
    assert result.ret == 0, result.stderr.str()
    assert collected_ids(result) == ["snapkv+kivi-64-passage_retrieval_en", "think+kivi-64-passage_retrieval_en",
                                     "snapkv+think+kivi-64-passage_retrieval_en"]


# -- the gate compares only like with like ----------------------------------------------------


@pytest.mark.parametrize("change, reason", [
    ({"model": {"name": "default", "dtype": "bfloat16"}}, "model dtype differs (baseline 'float32', this run 'bfloat16')"),
    ({"model": {"name": "default", "dtype": "float32", "attn_implementation": "eager"}},
     "model attn implementation differs"),
    ({"max_prompt_tokens": 320}, "max prompt tokens differs (baseline None, this run 320)"),
])
def test_a_settings_change_is_a_mismatch_not_a_regression(change, reason):
    baseline = make_record([1.0] * 30) | {"model": {"name": "default", "dtype": "float32", "attn_implementation": "sdpa"}}
    current = make_record([0.0] * 30) | change  # a collapse that would be a regression if compared
    verdict = compare_record(typed(current), BaselineEntry.of(typed(baseline)), DEFAULT)
    assert verdict.status == "mismatch"
    assert any(reason in r for r in verdict.reasons), verdict.reasons


def test_a_baseline_from_before_max_prompt_tokens_was_recorded_means_the_default():
    written = BaselineEntry.of(typed(make_record([1.0] * 10))).to_json()
    del written["max_prompt_tokens"]
    entry = from_json(BaselineEntry, written)
    assert compare_record(typed(make_record([1.0] * 10)), entry, DEFAULT).status == "ok"
    assert compare_record(typed(make_record([1.0] * 10) | {"max_prompt_tokens": 100}), entry, DEFAULT).status == "mismatch"


def test_kl_against_a_baseline_near_zero_is_shown_as_an_absolute_change():
    base = make_record([1.0] * 10)
    for s in base["samples"]:
        s["kl"] = 1e-12
    current = make_record([1.0] * 10)
    for s in current["samples"]:
        s["kl"] = 0.25
    table = comparison_table([compare_record(typed(current), BaselineEntry.of(typed(base)), DEFAULT)])
    kl_row = next(line for line in table.splitlines() if " kl " in line)
    assert "+0.2500" in kl_row and "%" not in kl_row


# -- files go only where the run lives -------------------------------------------------------


@pytest.mark.parametrize("field, value", [("budget", ".."), ("budget", "../.."), ("task", ".."), ("task", "."),
                                          ("task", "../../x"), ("model", "..")])
def test_item_folders_stay_inside_the_run_whatever_the_record_says(tmp_path, field, value):
    record = make_record([1.0])
    if field == "budget":
        record["budget"]["spec"] = value
    elif field == "task":
        record["task"]["name"] = value
    else:
        record["model"]["name"] = value
    record["item_id"] = ".."
    folder = item_dir(tmp_path / "run", typed(record), show_seed=False)
    assert folder.parent.parent == tmp_path / "run"
    assert folder.name not in (".", "..") and folder.parent.name not in (".", "..")


def _craft(record: dict, field: str, value: str) -> None:
    if field == "key":  # the key's labels name the item folders: a crafted method label in it
        record["key"] = record["key"].replace("|snapkv|", f"|{value}|").replace("|full|full|", f"|{value}|full|")
    elif field == "budget":
        record["budget"]["spec"] = value
    else:
        record[field]["name"] = value


@pytest.mark.parametrize("field, value", [
    ("task", ".."), ("task", "../../x"), ("task", "qasper/x"), ("task", ""), ("method", "../snapkv"),
    ("method", "snap kv"), ("method", "a\\b"), ("model", ".."), ("model", "org/../../x"), ("model", "m\x00x"),
    ("model", ""), ("budget", ".."), ("budget", "../.."), ("key", "snapkv(window=../../x)"), ("key", "../x"),
])
def test_merge_refuses_records_whose_names_are_not_names(tmp_path, field, value):
    crafted = standard_records()
    _craft(crafted[0], field, value)
    write_run(tmp_path, crafted)
    write_run(tmp_path, standard_records(run_id=OTHER_ID, seeds=(1,)), run_id=OTHER_ID)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    with pytest.raises(RunError) as refused:
        merge_runs([RUN_ID, OTHER_ID], tmp_path)
    message = str(refused.value)
    named = "method" if field == "key" else field
    assert "\n" not in message and f"run {RUN_ID}: record" in message and f"invalid {named} name" in message
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before, "a refused merge wrote something"


def test_merge_takes_records_with_real_names(tmp_path):
    records = standard_records()
    _craft(records[0], "task", "niah_single_1:questions=2")
    _craft(records[1], "model", "org/model-1.5B")
    write_run(tmp_path, records)
    write_run(tmp_path, standard_records(run_id=OTHER_ID, seeds=(1,)), run_id=OTHER_ID)
    merged = merge_runs([RUN_ID, OTHER_ID], tmp_path)
    merged_dir = load_run(merged, tmp_path).path
    for path in merged_dir.rglob("metrics.json"):
        assert path.parent.parent.parent == merged_dir
