"""--kvbench-protocol: which protocols a grid runs, and which tasks can serve them (usage errors).

A grid may hold several protocols (``--kvbench-protocol question_in_window,shared_context``): each
case runs under one. Every task serves the single-prompt protocols and shared_context (samples with the
same context form a group; a context with one question is a group of one); multi_turn needs a task whose
samples are the turns of a conversation (``Task.has_turns``: SCBench, RULER with ``:questions=K``), and an
SCBench task with the model's own history (``:history=model``) serves multi_turn only. Naming
a task that cannot serve a protocol is a usage error; a default task that cannot is left out of the grid.
A method re-compressing after each turn (``per_turn=true``) needs multi_turn and nothing else.
"""

from __future__ import annotations

from kvmethods import Capability, describe_method
from kvmethods.core.catalog import PROTOCOLS

from pytest_kvbench.cases import Grid, GridError
from pytest_kvbench.input_values import shown, split_list
from pytest_kvbench.tasks import get_task


def parse_protocols(value, where: str = "--kvbench-protocol") -> list[str]:
    protocols = list(dict.fromkeys(str(p) for p in split_list(value, where)))
    for protocol in protocols:
        if protocol not in PROTOCOLS:
            raise GridError(f"unknown protocol {shown(protocol)}; valid: {', '.join(PROTOCOLS)}")
    if not protocols:
        raise GridError(f"--kvbench-protocol is empty; valid: {', '.join(PROTOCOLS)}")
    return protocols


def serves(task, protocol: str) -> bool:
    return task.has_turns if protocol == "multi_turn" else not task.only_in_conversation


def _why_not(task_name: str, protocol: str) -> str:
    if protocol == "multi_turn":
        return (f"task {task_name} cannot run under protocol {protocol}: its samples have no turns (multi_turn "
                f"needs a multi-turn task such as SCBench's, or RULER's niah/vt/qa with :questions=K)")
    return (f"task {task_name} cannot run under protocol {protocol}: history=model feeds the model's own answers, "
            f"which exist only in a conversation (use --kvbench-protocol multi_turn, or the default gold history)")


def check_tasks_serve_protocols(grid: Grid, tasks_named: bool) -> None:
    """GridError for a named task that cannot serve a protocol of the grid; default tasks that cannot
    are recorded in grid.unserved (and so make no case)."""
    for task_name in grid.tasks:
        task = get_task(task_name)
        for protocol in grid.protocols:
            if serves(task, protocol):
                continue
            if tasks_named:
                raise GridError(_why_not(task_name, protocol))
            grid.unserved.add((task_name, protocol))


def check_decoding_intervals(grid: Grid) -> None:
    """GridError for a method that compresses every `interval` new tokens on a task generating fewer:
    it would never compress while decoding, so its numbers would not be what its name says."""
    for spec in grid.methods:
        interval = describe_method(spec.name, **dict(spec.params)).params.get("interval")
        if not isinstance(interval, int):
            continue
        for task_name in grid.tasks:
            generated = get_task(task_name).max_new_tokens
            if interval > generated:
                raise GridError(f"method {spec.label}: interval {interval} exceeds the {generated} tokens {task_name} "
                                f"generates, so it would never compress while decoding (lower the interval)")


def check_per_turn(grid: Grid) -> None:
    """GridError for a method re-compressing after each turn in a grid with a protocol that has no turns:
    it would run as the plain method under another name."""
    others = [protocol for protocol in grid.protocols if protocol != "multi_turn"]
    if not others:
        return
    for spec in grid.methods:
        if Capability.RECOMPRESSES_PER_TURN in describe_method(spec.name, **dict(spec.params)).capabilities:
            raise GridError(f"method {spec.label}: per_turn re-compresses after each turn, but protocol {others[0]} "
                            f"has no turns (use --kvbench-protocol multi_turn alone)")
