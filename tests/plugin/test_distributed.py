"""One worker per GPU, and --kvbench-shard K/N across machines."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from fractions import Fraction

import pytest
import torch

from pytest_kvbench.wiring.distributed.gpu_slots import (
    DeviceSlots,
    UsageLikeError,
    apply_environment,
    assign_device,
    visible_devices,
    worker_index,
)
from helpers import BENCH
from pytest_kvbench.input_values import parse_shard
from pytest_kvbench.wiring.distributed.shards import select_shard, shard_cuts
from pytest_kvbench.wiring.distributed.xdist_groups import parametrize_id, xdist_group_name

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

# ---------------------------------------------------------------------------- worker ids


@pytest.mark.parametrize(
    ("worker_id", "expected"), [("gw0", 0), ("gw3", 3), ("gw12", 12), ("master", None), (None, None)]
)
def test_worker_index(worker_id, expected):
    assert worker_index(worker_id) == expected


@pytest.mark.parametrize("worker_id", ["gw", "gwx", "worker1", "gw1 ", ""])
def test_worker_index_rejects_unknown_ids(worker_id):
    with pytest.raises(ValueError, match="not an xdist worker id"):
        worker_index(worker_id)


# ---------------------------------------------------------------------------- assign_device


def _env(visible: str | None = None, workers: int | None = None) -> dict[str, str]:
    environ = {}
    if visible is not None:
        environ["CUDA_VISIBLE_DEVICES"] = visible
    if workers is not None:
        environ["PYTEST_XDIST_WORKER_COUNT"] = str(workers)
    return environ


@pytest.mark.parametrize(
    ("worker_id", "visible", "count", "expected"),
    [
        ("gw0", None, 8, "0"),
        ("gw5", None, 8, "5"),
        ("gw0", "4,5,6", 3, "4"),
        ("gw1", "4,5,6", 3, "5"),
        ("gw2", "4,5,6", 3, "6"),
        ("gw1", " 7 , 3 ", 2, "3"),
        ("gw1", "GPU-aaaa,GPU-bbbb", 2, "GPU-bbbb"),
    ],
)
def test_worker_k_takes_the_kth_visible_gpu(worker_id, visible, count, expected):
    environ = _env(visible, workers=count)
    assert assign_device(worker_id, environ, count) == {"CUDA_VISIBLE_DEVICES": expected}


def test_every_worker_gets_a_different_gpu():
    environ = _env("0,1,2,3,4,5,6,7", workers=8)
    chosen = [assign_device(f"gw{k}", environ, 8)["CUDA_VISIBLE_DEVICES"] for k in range(8)]
    assert sorted(chosen) == [str(i) for i in range(8)]


@pytest.mark.parametrize(("worker_id", "count"), [("master", 8), (None, 8), ("gw0", 0), ("gw3", 0)])
def test_no_changes_for_the_controller_or_a_cpu_only_machine(worker_id, count):
    assert assign_device(worker_id, _env(workers=4), count) == {}


def test_no_changes_when_no_gpu_is_visible():
    assert assign_device("gw0", _env("", workers=2), 1) == {}


def test_more_workers_than_gpus_is_a_usage_error():
    with pytest.raises(UsageLikeError) as info:
        assign_device("gw0", _env("4,5,6", workers=4), 3)
    message = str(info.value)
    assert "\n" not in message
    assert "4 xdist workers but only 3 GPU(s)" in message
    assert "CUDA_VISIBLE_DEVICES=4,5,6" in message
    assert "--kvbench-allow-oversubscribe" in message
    assert isinstance(info.value, ValueError)


def test_more_workers_than_gpus_without_visible_devices_names_the_machine():
    with pytest.raises(UsageLikeError, match="only 2 GPU"):
        assign_device("gw1", _env(workers=3), 2)


def test_oversubscription_shares_gpus_round_robin_when_allowed():
    environ = _env("4,5", workers=5)
    chosen = [assign_device(f"gw{k}", environ, 2, allow_oversubscribe=True)["CUDA_VISIBLE_DEVICES"] for k in range(5)]
    assert chosen == ["4", "5", "4", "5", "4"]


def test_visible_devices_stop_at_what_cuda_can_see():
    # Entries past the device count (e.g. an index that does not exist) are not GPUs.
    assert visible_devices(_env("0,1,2,3"), 2) == ["0", "1"]
    assert visible_devices(_env("0,1"), 0) == []
    assert visible_devices({}, 3) == ["0", "1", "2"]


def test_a_replacement_worker_takes_the_crashed_workers_gpu():
    slots = DeviceSlots()
    environ = _env("4,5,6,7", workers=4)
    for k in range(4):
        assert slots.acquire(f"gw{k}") == k
    slots.release("gw1")               # gw1 crashed; xdist starts gw4 in its place
    slot = slots.acquire("gw4")
    assert slot == 1
    assert assign_device("gw4", environ, 4, slot=slot) == {"CUDA_VISIBLE_DEVICES": "5"}
    assert slots.acquire("gw4") == 1   # asking again does not take another GPU


def test_apply_environment_sets_the_variables():
    environ = {"CUDA_VISIBLE_DEVICES": "4,5,6"}
    apply_environment({"CUDA_VISIBLE_DEVICES": "5"}, environ)
    assert environ == {"CUDA_VISIBLE_DEVICES": "5"}


def test_apply_environment_refuses_once_cuda_is_initialised(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    environ = {"CUDA_VISIBLE_DEVICES": "4,5,6"}
    with pytest.raises(RuntimeError, match="already initialised"):
        apply_environment({"CUDA_VISIBLE_DEVICES": "5"}, environ)
    assert environ == {"CUDA_VISIBLE_DEVICES": "4,5,6"}
    apply_environment({}, environ)  # nothing to change is fine


@pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B-Instruct", "weird@name]x", "a b"])
def test_xdist_group_names_survive_xdist_nodeid_splitting(model):
    name = xdist_group_name(model)
    nodeid = f"bench/test_longbench.py::test_task[{model}-snapkv-1024]@{name}"
    # What xdist's loadgroup scheduler does to find the group of a node id:
    assert nodeid.rfind("@") > nodeid.rfind("]")
    assert nodeid.split("@")[-1] == name


def test_xdist_groups_follow_the_shared_reference():
    """Items sharing a full-cache reference share a group; other tasks, lengths, seeds, models do not."""
    from kvmethods import Budget
    from pytest_kvbench.cases import Case, MethodSpec

    def case(method="snapkv", budget="128", task="niah_single_1", ctx=2048, seed=0, model="org/a"):
        return Case(model, MethodSpec(method), Budget.parse(budget), task, "ruler", ctx, seed, 20)

    group = xdist_group_name(case().reference_group)
    assert xdist_group_name(case("full", "full").reference_group) == group
    assert xdist_group_name(case("h2o", "64").reference_group) == group
    for other in (case(task="vt"), case(ctx=4096), case(seed=1), case(model="org/b")):
        assert xdist_group_name(other.reference_group) != group


@pytest.mark.parametrize(
    ("nodeid", "expected"),
    [
        ("bench/test_ruler.py::test_ruler[snapkv-128-vt-ctx2048]", "snapkv-128-vt-ctx2048"),
        ("bench/test_ruler.py::test_ruler[snapkv-128-vt-ctx2048]@kvbench_x", "snapkv-128-vt-ctx2048"),
        ("bench/test_longbench.py::test_longbench[snapkv(window=8)-r0.5-qasper]", "snapkv(window=8)-r0.5-qasper"),
        ("tests/test_x.py::test_plain", None),
        ("tests/test_x.py::test_plain@group", None),
    ],
)
def test_parametrize_id(nodeid, expected):
    assert parametrize_id(nodeid) == expected


# ---------------------------------------------------------------------------- parse_shard


@pytest.mark.parametrize(
    ("spec", "expected"), [("1/1", (1, 1)), ("2/3", (2, 3)), ("3/3", (3, 3)), (" 4 / 16 ", (4, 16))]
)
def test_parse_shard(spec, expected):
    assert parse_shard(spec) == expected


@pytest.mark.parametrize("spec", ["0/3", "4/3", "x", "1/0", "-1/3", "1/3/4", "2", "", "1.5/3"])
def test_parse_shard_rejects_bad_specs_in_one_line(spec):
    with pytest.raises(ValueError) as info:
        parse_shard(spec)
    assert "--kvbench-shard" in str(info.value)
    assert repr(spec) in str(info.value)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------------------- select_shard

MODELS = ["qwen", "llama", "mistral"]


def _grid(models=MODELS, methods=("full", "snapkv", "pyramidkv"), budgets=("128", "1024"),
          tasks=("qasper", "hotpotqa", "niah")) -> list[tuple[str, str, str, str]]:
    return list(itertools.product(models, methods, budgets, tasks))


def _model(item):
    return item[0]


def _shards(items, n, **kwargs):
    return [select_shard(items, k, n, _model, **kwargs) for k in range(1, n + 1)]


def test_shards_1_2_3_of_3_cover_the_grid_exactly_once():
    grid = _grid()
    shards = _shards(grid, 3)
    counts = Counter(item for shard in shards for item in shard)
    assert set(counts) == set(grid)
    assert set(counts.values()) == {1}


def test_three_models_on_three_machines_load_one_model_each():
    shards = _shards(_grid(), 3)
    assert [{_model(item) for item in shard} for shard in shards] == [{"llama"}, {"mistral"}, {"qwen"}]


def test_whole_models_per_shard_when_the_counts_divide():
    grid = _grid(models=[f"m{i}" for i in range(8)])
    for n in (1, 2, 4, 8):
        shards = _shards(grid, n)
        models_per_shard = [{_model(item) for item in shard} for shard in shards]
        assert all(len(models) == 8 // n for models in models_per_shard)
        assert sum(len(models) for models in models_per_shard) == 8  # no model split


def test_a_group_boundary_close_to_an_even_split_wins():
    # 20 + 22 items on 2 machines: cutting at the model boundary (20/22) beats 21/21 with
    # one model loaded on both machines.
    items = [("a", i) for i in range(20)] + [("b", i) for i in range(22)]
    first, second = _shards(items, 2)
    assert {_model(item) for item in first} == {"a"}
    assert {_model(item) for item in second} == {"b"}


def test_one_big_model_is_split_evenly_rather_than_idling_machines():
    items = [("only", i) for i in range(10)]
    assert [len(shard) for shard in _shards(items, 3)] == [3, 3, 4]


def test_uneven_groups_stay_balanced():
    items = [("a", i) for i in range(50)] + [("b", i) for i in range(7)] + [("c", i) for i in range(31)]
    for n in range(1, 9):
        shards = _shards(items, n)
        assert sorted(item for shard in shards for item in shard) == sorted(items)
        sizes = [len(shard) for shard in shards]
        share = len(items) / n
        assert max(sizes) - min(sizes) <= 2 * int(0.1 * share) + 1


def test_more_shards_than_items_leaves_some_empty_but_covers_all():
    items = [("a", 0), ("b", 0)]
    shards = _shards(items, 5)
    assert sorted(item for shard in shards for item in shard) == sorted(items)
    assert sum(1 for shard in shards if not shard) == 3


def test_shards_keep_the_given_item_order():
    grid = _grid()
    for shard in _shards(grid, 4):
        assert shard == sorted(shard, key=grid.index)


def test_shards_are_the_same_on_every_machine_whatever_the_collection_order():
    grid = _grid()
    shuffled = grid[:]
    random.Random(7).shuffle(shuffled)
    for k in (1, 2, 3, 4):
        here = select_shard(grid, k, 4, _model, item_key=repr)
        there = select_shard(shuffled, k, 4, _model, item_key=repr)
        assert sorted(here) == sorted(there)


def test_select_shard_rejects_out_of_range():
    with pytest.raises(ValueError):
        select_shard(_grid(), 0, 3, _model)
    with pytest.raises(ValueError):
        select_shard(_grid(), 4, 3, _model)


def test_shard_cuts_are_even_without_slack():
    assert shard_cuts([20, 22], 2, slack=0) == [0, 21, 42]
    with pytest.raises(ValueError):
        shard_cuts([1], 1, slack=0.5)


def test_shards_cover_exactly_once_for_any_grouping():
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies

    @hypothesis.settings(max_examples=200, deadline=None)
    @hypothesis.given(sizes=st.lists(st.integers(0, 40), max_size=8), n=st.integers(1, 12),
                      slack=st.sampled_from([0.0, 0.1, 0.3]))
    def check(sizes, n, slack):
        items = [(f"m{g}", i) for g, size in enumerate(sizes) for i in range(size)]
        shards = _shards(items, n, slack=slack)
        assert Counter(item for shard in shards for item in shard) == Counter(items)
        share = Fraction(len(items), n)
        tolerance = int(Fraction(str(slack)) * share)  # exact: floats put 0.3 * 210 / 9 on either side of 7
        assert max(map(len, shards)) <= share + tolerance + 1
        assert min(map(len, shards)) >= share - tolerance - 1

    check()


# ---------------------------------------------------------------------------- --kvbench-shard in a run


@pytest.mark.parametrize("select", [[], ["-k", "snapkv or ruler"]], ids=["default-selection", "-k"])
def test_shards_split_what_runs_unsharded(bench, select):
    """`pytest bench/ --kvbench-shard K/3`: the three shards hold exactly what runs unsharded (after -k and the
    default selection, bench/test_kernels.py's timings included), each item once, in even parts. The shard used
    to be cut before the default selection (shard 1/3 of `pytest bench/` kept only the kernel timings, shards 2
    and 3 the rest) and before -k, and kept the kernel timings on every shard."""
    bench.makepyfile(test_suite_kernels=(BENCH / "test_kernels.py").read_text())

    def collected(*extra):
        result = bench.runpytest("--collect-only", "-q", *select, *extra)
        assert result.ret == 0, result.stdout.str()[-2000:]
        return [line for line in result.outlines if "::" in line], result.stdout.str()

    unsharded, summary = collected()
    assert "deselected" in summary  # the default selection or -k left items out
    assert any("kernels" in item for item in unsharded) and any("kernels" not in item for item in unsharded)
    parts = [collected("--kvbench-shard", f"{k}/3")[0] for k in (1, 2, 3)]
    assert sorted(item for part in parts for item in part) == sorted(unsharded)  # all of it, each item once
    sizes = [len(part) for part in parts]
    share = len(unsharded) / 3
    assert min(sizes) > 0 and max(sizes) - min(sizes) <= 2 * int(0.1 * share) + 1, sizes  # docs/slurm.md#shards


# ---------------------------------------------------------------------------- a worker's CPU threads


@pytest.mark.parametrize(("given", "workers", "environ", "cores", "expected"), [
    (None, None, {}, 2, None),  # a single process: torch's default
    (None, 2, {}, 2, 1),  # -n 2 on 2 cores: one thread each, not two
    (None, 4, {}, 16, 4),
    (None, 8, {}, 2, 1),  # oversubscribed workers still get a thread
    (3, 2, {}, 16, 3),  # --kvbench-torch-threads wins
    (None, 2, {"OMP_NUM_THREADS": "6"}, 16, None),  # the environment decides
])
def test_an_xdist_worker_takes_its_share_of_the_cores(monkeypatch, given, workers, environ, cores, expected):
    from pytest_kvbench.wiring.runner_settings import worker_threads

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert worker_threads(given, workers, environ) == expected
