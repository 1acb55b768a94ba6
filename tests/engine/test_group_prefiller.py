"""The runner's group work is an object of its own (engine/sample_prefills.GroupPrefiller): built from what it reads
and fills, with no Runner around it, one call returns a sample's full-cache reference and leaves every sharing
member's outcome waiting for its item, the outcome that member's own prefill and decoding give."""

from __future__ import annotations

import pytest

from kvmethods import Budget
from model_helpers import one_thread  # noqa: F401 - module-scoped autouse fixture
from pytest_kvbench.cases import Grid, MethodSpec
from pytest_kvbench.engine.case_methods import method_of
from pytest_kvbench.engine.decode_batching import DecodeBatching
from pytest_kvbench.engine.fidelity import ReferenceCache
from pytest_kvbench.engine.models import ModelCache
from pytest_kvbench.engine.sample_decoding import decode_compressed, reference_key
from pytest_kvbench.engine.sample_inputs import SampleInputs
from pytest_kvbench.engine.sample_outcomes import SharedPrefills
from pytest_kvbench.engine.sample_prefills import GroupPrefiller
from pytest_kvbench.engine.time_limit import item_time_limit
from pytest_kvbench.tasks import get_task


def test_a_prefiller_alone_makes_the_reference_and_each_members_own_outcome():
    grid = Grid(methods=[MethodSpec(m) for m in ["full", "snapkv", "h2o"]], budgets=[Budget.parse("16")],
                tasks=["niah_single_1"], context_lengths=[256], samples=1, data_dir="fixtures", max_prompt_tokens=320)
    full, *members = grid.cases("ruler", lambda task: "ruler")
    shared, references, inputs = SharedPrefills(), ReferenceCache(), SampleInputs(grid)
    shared.plan([full, *members])
    prefiller = GroupPrefiller(shared, DecodeBatching(1), references, inputs)
    loaded, _ = ModelCache().get("default", grid.dtype, grid.attn_implementation)
    task = get_task("niah_single_1")
    sample = inputs.samples(full, task, loaded)[0]
    prompt = inputs.prompt(full, task, sample, loaded)
    asked_time_left = []

    def time_left(member):
        asked_time_left.append(member.method.name)
        return None

    limit = item_time_limit(None)  # the running item's (no --kvbench-timeout here)
    with limit:
        reference = prefiller.reference(full, task, sample, prompt, loaded, limit, time_left)
    assert reference is not None and reference_key(full, sample) in references
    assert shared.waiting_count() == len(members) == 2
    assert sorted(asked_time_left) == ["h2o", "snapkv"]  # each member decoded on its own clock
    for member in members:
        outcome = shared.take(member, sample.id)
        alone, kl, agreement, decode_kl = decode_compressed(member, method_of(member), member.budget, task, sample,
                                                            prompt, loaded, reference)
        assert outcome.host == full.key and list(outcome.result.tokens) == list(alone.tokens)
        assert (outcome.kl, outcome.agreement, outcome.decode_kl) == pytest.approx((kl, agreement, decode_kl))
