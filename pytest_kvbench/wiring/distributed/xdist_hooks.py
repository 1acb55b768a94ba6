"""pytest-xdist's side of the plugin: GPU slots per worker, the run id, reference groups and crashes.

One worker per GPU: the controller refuses more workers than GPUs (unless oversubscribing is allowed)
and hands each worker a device slot, which the worker applies before anything starts CUDA. Every
worker appends to the controller's run. ``--dist loadgroup`` keeps the items sharing a full-cache
reference (and so a prefill) on one worker. A worker that dies inside an item leaves an `error`
record saying so, and the run is marked incomplete. The hooks are optional: without xdist they
never fire.
"""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from pytest_kvbench.results import record as records
from pytest_kvbench.wiring.distributed.gpu_slots import (SLOTS_KEY, DeviceSlots, apply_environment, assign_device,
                                                         cuda_device_count)
from pytest_kvbench.wiring.item_ids import item_id, item_ids
from pytest_kvbench.wiring.items import case_of_nodeid, expect
from pytest_kvbench.wiring.stash_keys import INTERRUPTED_WORKERS_KEY, SCHEDULED_GROUPS_KEY, SESSION_KEY
from pytest_kvbench.wiring.distributed.group_parts import sharing_groups
from pytest_kvbench.wiring.distributed.xdist_groups import reference_group_scheduler, xdist_group_name


def check_worker_count(config: pytest.Config) -> None:
    """Controller: more workers than GPUs is a usage error unless explicitly allowed."""
    workers = getattr(config.option, "numprocesses", None)
    if not isinstance(workers, int) or workers < 2:
        return
    environ = dict(os.environ, PYTEST_XDIST_WORKER_COUNT=str(workers))
    try:
        assign_device(f"gw{workers - 1}", environ, cuda_device_count(),
                      allow_oversubscribe=config.getoption("kvbench_allow_oversubscribe"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[SLOTS_KEY] = DeviceSlots()


def pin_worker_device(config: pytest.Config) -> None:
    """Worker: take the GPU slot the controller handed out, before anything initialises CUDA.

    torch.cuda.device_count() counts through NVML without starting CUDA (gpu_slots.cuda_device_count).
    """
    try:
        changes = assign_device(os.environ.get("PYTEST_XDIST_WORKER"), os.environ, cuda_device_count(),
                                allow_oversubscribe=config.getoption("kvbench_allow_oversubscribe"),
                                slot=config.workerinput.get("kvbench_device_slot"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    apply_environment(changes)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist controller: every worker appends to the same run and gets its own GPU slot."""
    config = node.config
    node.workerinput["kvbench_run_id"] = config.stash[SESSION_KEY].run_id
    node.workerinput["kvbench_dist"] = config.getvalue("dist")  # workers see dist "no"; sharing needs loadgroup
    slots = config.stash.get(SLOTS_KEY, None)
    if slots is not None:
        node.workerinput["kvbench_device_slot"] = slots.acquire(node.gateway.id)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """A worker that died frees its GPU slot for the replacement xdist starts. One stopped by Ctrl-C did not
    crash: its running item gets no record (it is missing, as in a serial run), not a crash record."""
    if error == "keyboard-interrupt":
        node.config.stash.setdefault(INTERRUPTED_WORKERS_KEY, set()).add(node.gateway.id)
    slots = node.config.stash.get(SLOTS_KEY, None)
    if slots is not None:
        slots.release(node.gateway.id)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: keep the items sharing a full-cache reference (or a part of one: group_parts.py) on
    one worker."""
    if config.getvalue("dist") != "loadgroup":
        return None
    cases = item_ids(config).cases  # by the items' pytest ids

    def groups_of(ids, workers: int) -> dict[str, str]:
        """The cut, once: the session ETA's model of the groups (progress/live.py) reads it from the stash."""
        selected = [cases[i] for i in ids if i in cases]
        parts = sharing_groups(selected, workers)
        named = config.stash[SCHEDULED_GROUPS_KEY] = {item_id(config, case): xdist_group_name(parts[case.key])
                                                      for case in selected}
        return named

    return reference_group_scheduler(config, log, groups_of)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids) -> None:
    """xdist controller: the items a worker will run are the items this run must finish."""
    expect(node.config, ids)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report, sched) -> None:
    """xdist controller: a worker died inside an item. Its record says so, and the run is incomplete."""
    config = getattr(sched, "config", None) or report.node.config
    case = case_of_nodeid(config, crashitem)
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "?")
    if case is None or worker in config.stash.get(INTERRUPTED_WORKERS_KEY, set()):
        return
    run = config.stash[SESSION_KEY]
    message = (f"worker {worker} crashed while running this item (the process died: killed, out of host "
               f"memory or a hard crash); run it again with --kvbench-resume {run.run_id}")
    record = records.Record.identity(case, run.run_id, case.protocol).finished(
        status="error", nodeid=crashitem, message=message, item_id=item_id(config, case))
    run.add(replace(record, crashed=True))
