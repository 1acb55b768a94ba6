"""Twins (engine/twins.py): members of a shared prefill whose caches would be equal are prefilled and decoded
once, and each twin gets exactly the outcome its own prefill and decoding give, with its own byte allowance."""

from __future__ import annotations

import pytest

from kvmethods import Budget, get_method
from kvmethods.runtime.budget_plan import selection_key
from model_helpers import one_thread  # noqa: F401 - module-scoped autouse fixture
from pytest_kvbench.cases import Grid, MethodSpec
from pytest_kvbench.engine.case_methods import method_of
from pytest_kvbench.engine.decode_batching import DecodeBatching
from pytest_kvbench.engine.fidelity import ReferenceCache
from pytest_kvbench.engine.models import ModelCache
from pytest_kvbench.engine.sample_decoding import decode_compressed
from pytest_kvbench.engine.sample_inputs import SampleInputs
from pytest_kvbench.engine.sample_outcomes import SharedPrefills
from pytest_kvbench.engine.sample_prefills import GroupPrefiller
from pytest_kvbench.engine.time_limit import item_time_limit
from pytest_kvbench.tasks import get_task


@pytest.fixture(scope="module")
def sample_setup():
    grid = Grid(methods=[MethodSpec(m) for m in ["full", "kivi", "snapkv"]],
                budgets=[Budget.parse("m0.125"), Budget.parse("m0.25")], tasks=["niah_single_1"],
                context_lengths=[256], samples=1, data_dir="fixtures", max_prompt_tokens=320)
    cases = grid.cases("ruler", lambda task: "ruler")
    inputs = SampleInputs(grid)
    loaded, _ = ModelCache().get("default", grid.dtype, grid.attn_implementation)
    task = get_task("niah_single_1")
    sample = inputs.samples(cases[0], task, loaded)[0]
    return grid, cases, inputs, loaded, task, sample, inputs.prompt(cases[0], task, sample, loaded)


def _key(loaded, prompt, method, budget):
    return selection_key(loaded.model, get_method(method), Budget.parse(budget), len(prompt.input_ids),
                         prompt.context_len, "question_in_window")


def test_a_quantizer_keeping_every_token_is_its_own_twin_across_budgets_and_an_evictor_is_not(sample_setup):
    *_, loaded, _, _, prompt = sample_setup
    assert _key(loaded, prompt, "kivi", "m0.125") == _key(loaded, prompt, "kivi", "m0.25")
    assert _key(loaded, prompt, "snapkv", "m0.125") != _key(loaded, prompt, "snapkv", "m0.25")
    assert _key(loaded, prompt, "snapkv", "m0.125") != _key(loaded, prompt, "knorm", "m0.125")
    # budgets that both keep the whole prompt make the same (uncompressed) cache
    assert _key(loaded, prompt, "snapkv", "4096") == _key(loaded, prompt, "snapkv", "8192")


def test_twins_are_decoded_once_and_each_gets_its_own_decodings_outcome(sample_setup):
    grid, cases, inputs, loaded, task, sample, prompt = sample_setup
    full, *members = cases
    shared, references = SharedPrefills(), ReferenceCache()
    shared.plan(cases)
    prefiller = GroupPrefiller(shared, DecodeBatching(1), references, inputs)
    group = prefiller.prefill(members, task, prompt, loaded, full.protocol)
    kivi = [index for index, m in enumerate(members) if m.method.name == "kivi"]
    assert [group.twin_of[i] for i in kivi] == [None, kivi[0]]  # the second kivi rides with the first
    assert group.selections[kivi[1]] is None and group.selections[kivi[0]] is not None
    assert all(group.twin_of[i] is None for i, m in enumerate(members) if m.method.name == "snapkv")

    limit = item_time_limit(None)
    with limit:
        reference = prefiller.reference(full, task, sample, prompt, loaded, limit, lambda member: None)
    allowances = set()
    for member in members:
        outcome = shared.take(member, sample.id)
        alone, kl, agreement, decode_kl = decode_compressed(member, method_of(member), member.budget, task, sample,
                                                            prompt, loaded, reference)
        assert list(outcome.result.tokens) == list(alone.tokens)
        assert (outcome.kl, outcome.agreement, outcome.decode_kl) == pytest.approx((kl, agreement, decode_kl))
        assert outcome.result.kv_bytes_budget == alone.kv_bytes_budget  # its own budget's allowance
        assert outcome.result.kv_bytes_after == alone.kv_bytes_after
        if member.method.name == "kivi":
            allowances.add(outcome.result.kv_bytes_budget)
    assert len(allowances) == 2
    twin = members[kivi[1]]
    assert shared.take(twin, sample.id) is None  # taken once


def test_a_twins_sample_row_names_the_item_it_shares_its_decoding_with(sample_setup):
    grid, cases, inputs, loaded, task, sample, prompt = sample_setup
    full, *members = cases
    shared = SharedPrefills()
    shared.plan(cases)
    prefiller = GroupPrefiller(shared, DecodeBatching(1), ReferenceCache(), inputs)
    limit = item_time_limit(None)
    with limit:
        prefiller.reference(full, task, sample, prompt, loaded, limit, lambda member: None)
    kivi = [m for m in members if m.method.name == "kivi"]
    first, second = (shared.take(m, sample.id) for m in kivi)
    assert "twin_of" not in first.timing and second.timing["twin_of"] == kivi[0].id
    assert second.result.decode_s == first.result.decode_s  # the decoding both stand on
