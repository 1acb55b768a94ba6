"""The case model (pytest_kvbench/cases.py) and the one spelling of no compression, kvmethods.FULL_CACHE.

The full-cache reference used to be written five ways (a `full` method, a FULL_CACHE budget object, a
FULL_METHOD name, a zero-ratio NO_COMPRESSION budget, and that zero-ratio budget again in the shared
prefill); a case is now the reference exactly when its budget is FULL_CACHE, and that budget reads back
from its own spelling, keeps every token and sorts before every compressed budget.
"""

import pytest

from kvmethods import FULL_CACHE, Budget, MethodError
from pytest_kvbench.cases import Case, Grid, MethodSpec
from pytest_kvbench.results.record import Record, budget_sort_key
from pytest_kvbench.record_key import DEFAULT_PROTOCOL, protocol_key_part

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


def test_full_cache_reads_back_from_its_spelling_and_keeps_everything():
    assert Budget.parse(FULL_CACHE.spec) == FULL_CACHE and Budget.parse(" full ") == FULL_CACHE
    assert FULL_CACHE.as_record() == {"spec": "full", "kind": "none", "value": None}  # what records held before
    assert [FULL_CACHE.tokens_for(n) for n in (0, 1, 4096)] == [0, 1, 4096]
    assert Budget.parse("r0").tokens_for(4096) == 4096  # a user's zero ratio is a budget of its own, not the reference
    assert Budget.parse("r0") != FULL_CACHE
    with pytest.raises(MethodError):
        Budget.parse("Full")


def test_full_cache_sorts_before_every_budget():
    specs = ["m0.5", "r0.25", "full", "1024", "r0.75", "128", "m0.1"]
    assert sorted(specs, key=budget_sort_key) == ["full", "128", "1024", "r0.75", "r0.25", "m0.1", "m0.5"]
    assert sorted(specs, key=lambda s: Budget.parse(s).sort_key) == sorted(specs, key=budget_sort_key)


def _grid(**kw) -> Grid:
    return Grid(methods=[MethodSpec("full"), MethodSpec("snapkv", (("window", "16"),))],
                budgets=[Budget.parse("r0.5"), Budget.parse("128")], tasks=["qasper", "niah_single_1"],
                context_lengths=[4096], smoke_tasks=["qasper"], **kw)


def test_the_full_method_runs_once_per_task_with_the_full_cache():
    cases = _grid().cases("longbench", lambda task: "longbench" if task == "qasper" else "ruler")
    assert [(c.method.label, c.budget.spec) for c in cases] == [("full", "full"), ("snapkv(window=16)", "r0.5"),
                                                                ("snapkv(window=16)", "128")]
    reference, *compressed = cases
    assert reference.is_reference and not any(c.is_reference for c in compressed)
    assert reference.id == "full-qasper" and compressed[0].id == "snapkv(window=16)-r0.5-qasper"
    assert reference.key == "default|full|full|qasper|seed0"
    assert {c.reference_group for c in cases} == {reference.reference_group}
    assert [c.smoke for c in cases] == [True, False, True]  # the reference and the smallest budget


def test_a_case_key_reads_back_as_its_labels():
    case = Case("org/model-a", MethodSpec("snapkv"), Budget.parse("r0.5"), "niah_single_1", "ruler", 4096, 1, 3,
                protocol="multi_turn")
    record = Record.identity(case, "run", case.protocol)
    assert record.to_json()["budget"] == {"spec": "r0.5", "kind": "ratio", "value": 0.5}
    assert tuple(record.labels) == ("org/model-a", "snapkv", "r0.5", "niah_single_1@4096", "seed1", "multi_turn", "keep")
    assert case.key.endswith(protocol_key_part("multi_turn")) and protocol_key_part(DEFAULT_PROTOCOL) == ""


def test_a_method_that_evicts_nothing_runs_at_the_grids_storage_budgets():
    """A quantizer keeps every token whatever the token budget: with storage budgets (the default grid's byte budget)
    it runs at those alone, its smallest one smoke; an evictor composed with it keeps the token budgets."""
    grid = Grid(methods=[MethodSpec("full"), MethodSpec("snapkv"), MethodSpec("kivi"), MethodSpec("snapkv+kivi")],
                budgets=[Budget.parse("256"), Budget.parse("128")], tasks=["qasper"], smoke_tasks=["qasper"],
                storage_budgets=[Budget.parse("m0.25"), Budget.parse("m0.125")])
    cases = grid.cases("longbench", lambda task: "longbench")
    assert [(c.method.label, c.budget.spec, c.smoke) for c in cases] == [
        ("full", "full", True), ("snapkv", "256", False), ("snapkv", "128", True), ("kivi", "m0.25", False),
        ("kivi", "m0.125", True), ("snapkv+kivi", "256", False), ("snapkv+kivi", "128", True)]
    assert grid.as_dict()["storage_budgets"] == ["m0.25", "m0.125"]
    grid.storage_budgets = []  # budgets given: every method runs at them, and the settings read as before
    assert [(c.budget.spec, c.smoke) for c in grid.cases("longbench", lambda task: "longbench")
            if c.method.name == "kivi"] == [("256", False), ("128", True)]
    assert "storage_budgets" not in grid.as_dict()
