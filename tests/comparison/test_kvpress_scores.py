"""pytest_kvbench/comparison/kvpress_scores.py: native rows beside kvpress's on the same samples, and when they differ."""

from __future__ import annotations

import pytest

import pytest_kvbench.comparison.kvpress_scores as KT
from kvmethods import get_method
from pytest_kvbench.cases import MethodSpec
from tests.test_cli_support import typed
from tests.test_cli_support import make_record as record_json

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


def make_record(*args, **kwargs):
    return typed(record_json(*args, **kwargs))


def pressed(scores, spec):
    return make_record(scores, method=KT.press_name(spec), budget="r0.9")


def test_rows_pair_each_method_with_its_press_and_flag_differences_beyond_the_intervals():
    ours = [make_record([1] * 10, method="snapkv", budget="r0.9"), make_record([1, 0] * 5, method="tova", budget="r0.9")]
    theirs = [pressed([0] * 10, KT.NATIVE_PRESSES["snapkv"]), pressed([0, 1] * 5, KT.NATIVE_PRESSES["tova"])]
    rows = {row[0]: row for row in KT.score_rows(ours, theirs)}
    assert rows["snapkv"][1:5] == ["kvpress:SnapKVPress", "r0.9", "100.0 ± 0.0", "0.0 ± 0.0"]
    assert rows["snapkv"][5].startswith("-100.0") and rows["snapkv"][6] == "yes"
    assert rows["tova"][3].startswith("50.0 ± ") and rows["tova"][5].startswith("+0.0") and rows["tova"][6] == ""


def test_a_method_without_its_press_row_is_left_out():
    assert KT.score_rows([make_record([1, 1], method="snapkv", budget="r0.9")], []) == []


def test_every_native_method_and_press_spec_parses():
    for method, spec in KT.NATIVE_PRESSES.items():
        get_method(method)
        assert KT.press_name(spec) == MethodSpec.parse(spec).name and KT.press_name(spec).count(":") == 1


def test_rows_compare_only_the_samples_both_sides_ran():
    ours = [make_record([1, 1, 0, 0], method="snapkv", budget="r0.9")]  # ids qasper-0 .. qasper-3
    theirs = [pressed([1, 1], KT.NATIVE_PRESSES["snapkv"])]
    (row,) = KT.score_rows(ours, theirs)
    assert row[3] == "100.0 ± 0.0" and row[4] == "100.0 ± 0.0" and row[6] == ""


def test_a_method_whose_press_takes_no_budget_has_no_press_row():
    assert "simlayerkv" not in KT.NATIVE_PRESSES and "chunkkv" in KT.NATIVE_PRESSES
