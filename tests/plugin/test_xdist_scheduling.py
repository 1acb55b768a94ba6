"""--dist loadgroup: which worker runs which kvbench items; a reference group cut into parts for idle workers."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kvmethods import Budget
from pytest_kvbench.cases import Case, MethodSpec
from pytest_kvbench.wiring.distributed.group_parts import sharing_groups
from pytest_kvbench.wiring.distributed.xdist_groups import reference_group_scheduler

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

METHODS = ["snapkv", "pyramidkv", "h2o", "kvzip", "kivi"]


def case(method="snapkv", budget="128", task="niah_single_1"):
    return Case("org/a", MethodSpec(method), Budget.parse(budget), task, "ruler", 2048, 0, 20)


def grid(tasks=("niah_single_1",), methods=METHODS, budgets=("64", "128", "256")):
    return [case("full", "full", task) for task in tasks] + [
        case(method, budget, task) for task in tasks for method in methods for budget in budgets]


# ---------------------------------------------------------------------------- sharing_groups


def test_as_many_groups_as_workers_or_more_are_not_cut():
    cases = grid(tasks=("niah_single_1", "vt"))
    for workers in (1, 2, 3):
        assert sharing_groups(cases, workers) == {c.key: c.reference_group for c in cases}


def test_one_group_on_two_workers_is_cut_in_two_whole_methods_apart():
    cases = grid()
    groups = sharing_groups(cases, 2)
    parts = {name: [c for c in cases if groups[c.key] == name] for name in set(groups.values())}
    reference = cases[0].reference_group
    assert sorted(parts) == [f"{reference}|part1of2", f"{reference}|part2of2"]
    for method in {c.method.label for c in cases}:
        assert len({groups[c.key] for c in cases if c.method.label == method}) == 1, method
    # kvzip's scoring pass costs about what the other methods' items do together: it gets a part to itself
    assert sorted(sorted({c.method.name for c in part}) for part in parts.values()) == [
        ["full", "h2o", "kivi", "pyramidkv", "snapkv"], ["kvzip"]]


def test_each_group_gets_the_workers_it_has_to_itself():
    cases = grid(tasks=("niah_single_1", "vt"))
    groups = sharing_groups(cases, 5)  # 2 groups, 5 workers: 2 parts each (a fifth worker has nothing to cut)
    assert len(set(groups.values())) == 4
    for task in ("niah_single_1", "vt"):
        assert len({groups[c.key] for c in cases if c.task == task}) == 2


def test_a_group_is_cut_at_most_into_its_methods():
    cases = [case("full", "full"), case("snapkv", "64"), case("snapkv", "128")]
    groups = sharing_groups(cases, 8)
    assert len(set(groups.values())) == 2
    assert groups[cases[1].key] == groups[cases[2].key] != groups[cases[0].key]
    assert sharing_groups([case("snapkv", "64")], 8) == {case("snapkv", "64").key: case().reference_group}


def test_parts_are_balanced_by_item_count_without_a_whole_prompt_scorer():
    cases = [case("full", "full")] + [case(m, b) for m, n in (("snapkv", 4), ("pyramidkv", 3), ("h2o", 2), ("tova", 2),
                                                              ("streamingllm", 1)) for b in map(str, range(64, 64 + n))]
    for workers in (2, 3, 4):
        sizes = sorted(Counter(sharing_groups(cases, workers).values()).values())
        assert len(sizes) == workers and sizes[-1] - sizes[0] <= 1, (workers, sizes)


def test_the_cut_does_not_depend_on_the_collection_order():
    """The controller cuts from its collected ids, each worker from its own items: the same cut either way."""
    cases = grid(tasks=("niah_single_1", "vt"))
    expected = sharing_groups(cases, 4)
    for seed in range(5):
        shuffled = cases[:]
        random.Random(seed).shuffle(shuffled)
        assert sharing_groups(shuffled, 4) == expected


def test_a_deselected_method_leaves_the_others_cut_over_the_selection():
    """-k keeps one group's snapkv and full: two workers get one method each, not a cut of the whole grid."""
    selected = [c for c in grid(tasks=("niah_single_1", "vt")) if c.task == "vt" and c.method.name in ("full", "snapkv")]
    groups = sharing_groups(selected, 2)
    assert len(set(groups.values())) == 2
    assert {groups[c.key] for c in selected if c.method.name == "snapkv"} != {groups[selected[0].key]}


# ---------------------------------------------------------------------------- the scheduler


class Config:
    option = type("Option", (), {"loadscopereorder": True})()
    hook = type("Hook", (), {"pytest_xdist_auto_num_workers": None})()

    def __init__(self, workers: int = 2) -> None:
        self.workers = workers

    def getvalue(self, name):
        return {"tx": [f"{self.workers}*popen"]}.get(name)


class Node:
    def __init__(self, name):
        self.gateway = type("Gateway", (), {"id": name})()
        self.shutting_down, self.sent = False, []

    def shutdown(self):
        self.shutting_down = True

    def send_runtest_some(self, indexes):
        self.sent.append(indexes)


def scheduled(groups_of, ids, workers=2):
    scheduler = reference_group_scheduler(Config(workers), None, groups_of)
    nodes = [Node(f"gw{i}") for i in range(workers)]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, ids)
    scheduler.schedule()
    return scheduler, nodes


def test_the_scheduler_groups_kvbench_items_from_the_collection_without_nodeid_suffixes():
    """pytest >= 9.2 drops xdist's '@group' rename; the scheduler groups from the grid alone, asked once the
    collections are in (the selected ids and the worker count decide the cut)."""
    groups = {"full-vt-ctx2048": "kvbench_vt", "snapkv-128-vt-ctx2048": "kvbench_vt",
              "snapkv-128-hotpotqa": "kvbench_hotpotqa"}
    asked = []
    ids = ["bench/test_ruler.py::test_ruler[full-vt-ctx2048]", "bench/test_ruler.py::test_ruler[snapkv-128-vt-ctx2048]",
           "bench/test_longbench.py::test_longbench[snapkv-128-hotpotqa]@kvbench_hotpotqa",
           "bench/test_kernels.py::test_select[4096]", "tests/test_x.py::test_y@mine"]
    scheduler, nodes = scheduled(lambda got, workers: asked.append((got, workers)) or groups, ids)
    assert asked == [(["full-vt-ctx2048", "snapkv-128-vt-ctx2048", "snapkv-128-hotpotqa", "4096"], 2)]  # the hook
    # keeps the grid's ids (a kernel timing's id is not one)
    scope = scheduler._split_scope
    assert scope(ids[0]) == scope(ids[1]) == "kvbench_vt"
    assert scope(ids[2]) == "kvbench_hotpotqa"
    assert scope(ids[3]) == ids[3]
    assert scope(ids[4]) == "mine"
    assert sorted(i for node in nodes for sent in node.sent for i in sent) == [0, 1, 2, 3, 4]


def test_one_group_cut_in_parts_runs_one_part_per_worker():
    cases = grid()
    by_id = {c.id: c for c in cases}

    def groups_of(ids, workers):
        cut = sharing_groups([by_id[i] for i in ids], workers)
        return {i: cut[by_id[i].key] for i in ids}

    ids = [f"bench/test_ruler.py::test_ruler[{c.id}]" for c in cases]
    _, nodes = scheduled(groups_of, ids)
    parts = groups_of([c.id for c in cases], 2)
    for node in nodes:
        ran = [cases[i] for sent in node.sent for i in sent]
        assert ran and len({parts[c.id] for c in ran}) == 1
    assert sum(len(sent) for node in nodes for sent in node.sent) == len(cases)


def test_a_replacement_worker_gets_work_only_once_its_collection_is_registered():
    """A worker dies inside a group; xdist requeues the group and starts a replacement. xdist's loadscope handed
    work to a replacement whose collection it had not registered (KeyError: an INTERNALERROR, the run unlabelled).
    Now it waits for that collection, stops if xdist refused it, and takes the group once registered."""
    ids = ["bench/test_longbench.py::test_longbench[full-qasper]", "bench/test_longbench.py::test_longbench[snapkv-128-qasper]"]
    scheduler, (first, second) = scheduled(lambda got, workers: {i: "kvbench_q" for i in got}, ids)
    runner = first if first.sent else second
    assert runner.sent == [[0, 1]]
    scheduler.mark_test_complete(runner, 0)
    assert scheduler.remove_node(runner) == ids[1]  # the worker died inside the second item
    collecting, refused, replacement = Node("gw2"), Node("gw3"), Node("gw4")
    scheduler.add_node(collecting)
    scheduler.schedule()  # another worker's event while gw2 still collects: nothing for it yet, no KeyError
    assert collecting.sent == [] and not collecting.shutting_down
    scheduler.add_node(refused)
    scheduler.add_node_collection(refused, ids[::-1])  # a collection xdist refuses (another order)
    scheduler.schedule()
    assert refused.shutting_down and refused.sent == []
    scheduler.add_node(replacement)
    scheduler.add_node_collection(replacement, ids)
    scheduler.schedule()
    assert [collecting.sent, replacement.sent].count([[1]]) == 1  # the crashed item, once, to a registered worker
