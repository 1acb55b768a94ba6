"""Task names -> task objects. Building a task loads nothing and imports no heavy library,
so collecting thousands of items stays fast; data and metrics load when first used.

A task name may carry a generation length, ``math500:max_new_tokens=4096``: reasoning models
need their long default, a small model or a quick run does not. RULER's niah, vt and qa tasks also take a
number of questions per haystack, ``niah_single_1:questions=4`` (the shared_context protocol), and SCBench's tasks
the history of a conversation, ``scbench_kv:history=model`` (default gold answers). A suite whose optional
dependency is missing is a TaskError naming the extra to install, so a run stops at collection.

The names are the suites' tables (`_SUITE_TABLE`, each suite's specs) served by kvmethods' LazyRegistry, the one
registry type of every kind; a third party adds a task through the `kvbench.tasks` entry-point group: a Task
class or a function returning a Task whose `suite` is one of SUITES (its marker collects it), taking no settings.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
from typing import NamedTuple

from kvmethods.core.lazy_registry import LazyRegistry, unknown_name_message

from .base import Task
from .errors import TaskError


class _Suite(NamedTuple):
    package: str  # sub-package of pytest_kvbench.tasks
    specs: str  # "module.function" returning {task name: spec}
    task_class: str  # "module.Class" built from a spec
    needs: str | None  # optional module the suite imports
    extra: str | None  # pip extra that installs it
    description: str  # marker help and listings
    source: str  # where the data comes from (hub dataset)


_SUITE_TABLE = {
    "longbench": _Suite("longbench", "config.longbench_specs", "task.LongBenchTask", None, None,
                        "LongBench / LongBench-E task items", "THUDM/LongBench"),
    "ruler": _Suite("ruler", "specs.ruler_specs", "task.RulerTask", None, None, "RULER synthetic task items",
                    "generated (NVIDIA/RULER recipes)"),
    "longbench_v2": _Suite("longbench_v2", "task.longbench_v2_specs", "task.LongBenchV2Task", None, None,
                           "LongBench v2 multiple-choice items (with and without CoT)", "THUDM/LongBench-v2"),
    "infinitebench": _Suite("infinitebench", "specs.infinitebench_specs", "task.InfiniteBenchTask", None, None,
                            "InfiniteBench task items (12 tasks, 100k+ tokens)", "xinrongzhang2022/InfiniteBench"),
    "reasoning": _Suite("reasoning", "specs.reasoning_specs", "task.ReasoningTask", "math_verify", "reasoning",
                        "long-generation reasoning items (MATH-500, AIME 2024/2025)",
                        "HuggingFaceH4/MATH-500, HuggingFaceH4/aime_2024, yentinglin/aime_2025"),
    "scbench": _Suite("scbench", "specs.scbench_specs", "task.SCBenchTask", None, None,
                      "SCBench shared-context task items (one sample per turn)", "microsoft/SCBench"),
}
SUITES = tuple(_SUITE_TABLE)
SUITE_DESCRIPTIONS = {suite: entry.description for suite, entry in _SUITE_TABLE.items()}

_OVERRIDABLE = ("max_new_tokens", "questions")  # questions: per haystack (RULER niah, vt, qa)
# Largest value of each setting: far above any real use (a 1M-token generation; 1,024 questions in one
# haystack), low enough that a mistyped number is refused at collection instead of failing a run.
_OVERRIDE_MAXIMUM = {"max_new_tokens": 2**20, "questions": 1024}
# Settings that name one of a few choices: SCBench's multi-turn history (gold answers, or the model's own).
_CHOICES = {"history": ("gold", "model")}


def _module(suite: str, dotted: str):
    module, attribute = dotted.rsplit(".", 1)
    return getattr(importlib.import_module(f"{__package__}.{_SUITE_TABLE[suite].package}.{module}"), attribute)


@functools.cache
def _specs() -> dict[str, tuple[str, object]]:
    specs: dict[str, tuple[str, object]] = {}
    for suite, entry in _SUITE_TABLE.items():
        for name, spec in _module(suite, entry.specs)().items():
            specs[name] = (suite, spec)
    return specs


def _task_factory(obj: object, origin: str):
    if not callable(obj):
        raise TaskError(f"{origin}: {obj!r} is not a Task class or a function returning a Task")
    return obj


# names -> (suite, spec) from the suites' tables; the entry-point group's names -> a Task factory
TASKS = LazyRegistry("task", "kvbench.tasks", _specs, error=TaskError, check=_task_factory, sort=False)


def _plugin_task(name: str, factory) -> Task:
    """A third-party task built by its factory, checked: a Task of one of the suites."""
    origin = TASKS.origin(name)
    try:
        task = factory()
    except Exception as error:  # a broken third-party package must not crash collection: one line
        raise TaskError(f"{origin} failed to build its task: {type(error).__name__}: {error}") from error
    if not isinstance(task, Task) or getattr(task, "suite", None) not in SUITES:
        raise TaskError(f"{origin}: {task!r} is not a pytest_kvbench Task of one of the suites {', '.join(SUITES)}")
    return task


def missing_dependency(suite: str) -> str | None:
    """One line saying what to install when the suite's optional dependency is absent, else None."""
    entry = _SUITE_TABLE[suite]
    if entry.needs is None or importlib.util.find_spec(entry.needs) is not None:
        return None
    return f"the {suite} tasks need {entry.needs.replace('_', '-')}: pip install 'pytest-kvbench[{entry.extra}]'"


def available_tasks(suite: str | None = None) -> list[str]:
    if suite is not None and suite not in SUITES:
        raise TaskError(unknown_name_message("suite", suite, SUITES))
    if suite is None:
        return TASKS.names()
    return [name for name in TASKS.names() if suite_of(name) == suite]


def suite_of(name: str) -> str:
    """The suite of a task name (an override suffix allowed); TaskError for an unknown name."""
    return _lookup(split_name(name)[0])[0]


def split_name(name: str) -> tuple[str, dict[str, int | str]]:
    """``"math500:max_new_tokens=4096"`` -> ``("math500", {"max_new_tokens": 4096})``;
    ``"scbench_kv:history=model"`` -> ``("scbench_kv", {"history": "model"})``."""
    base, *parts = str(name).split(":")
    overrides: dict[str, int | str] = {}
    for part in parts:
        key, equals, value = part.partition("=")
        if key in overrides:
            raise TaskError(f"task {name[:80]!r} sets {key} twice ({key}={overrides[key]} and {part[:30]}); give it once")
        if key in _CHOICES and equals:
            if value not in _CHOICES[key]:
                raise TaskError(f"task {name[:80]!r}: {key} must be one of {', '.join(_CHOICES[key])}, "
                                f"got {value[:20]!r}")
            overrides[key] = value
            continue
        if key not in _OVERRIDABLE or not equals:
            raise TaskError(f"task {name!r}: unknown setting {part!r}; a task accepts {', '.join(_OVERRIDABLE)}=N, "
                            + ", ".join(f"{key}={'|'.join(values)}" for key, values in _CHOICES.items()))
        if not (value.isascii() and value.isdigit()) or int(value) <= 0:  # '١٢'.isdigit() is true
            raise TaskError(f"task {name!r}: {key} must be a positive integer, got {value!r}")
        if int(value) > _OVERRIDE_MAXIMUM[key]:
            raise TaskError(f"task {name[:80]!r}: {key} must be at most {_OVERRIDE_MAXIMUM[key]:,}, "
                            f"got {value if len(value) <= 20 else value[:20] + '...'}")
        overrides[key] = int(value)
    return base, overrides


def _lookup(base: str) -> tuple[str, object]:
    """(suite, spec) of a built-in task; (suite, the task itself) of a third party's."""
    entry = TASKS.get(base)
    if isinstance(entry, tuple):
        return entry
    task = _plugin_task(base, entry)
    return task.suite, task


def get_task(name: str) -> Task:
    base, overrides = split_name(name)
    suite, spec = _lookup(base)
    missing = missing_dependency(suite)
    if missing:
        raise TaskError(f"task {base!r}: {missing}")
    if isinstance(spec, Task):  # a third party's (kvbench.tasks)
        if overrides:
            raise TaskError(f"task {name!r}: {base} ({TASKS.origin(base)}) takes no settings")
        spec.name = str(name)
        return spec
    unknown = [key for key in overrides if not hasattr(spec, key)]
    if unknown:
        raise TaskError(f"task {name!r}: {base} takes no {unknown[0]} setting (questions: RULER niah, vt and qa "
                        f"tasks only; history: SCBench tasks only)")
    if overrides:
        spec = dataclasses.replace(spec, **overrides)
    task = _module(suite, _SUITE_TABLE[suite].task_class)(spec)
    task.name = str(name)
    return task


def runnable(names) -> tuple[str, ...]:
    """The names whose suite needs no missing optional dependency (so the default grid, wiring/grid/command_line.py,
    runs anywhere); asked at configure, since checking the optional dependencies imports the suite tables."""
    return tuple(name for name in names if missing_dependency(suite_of(name)) is None)


def task_listing(suite: str | None = None) -> list[dict]:
    """One row per task for ``kvbench tasks``: name, suite, metric, generation length, data source,
    and what to install when the suite's optional dependency is missing. Loads no data."""
    rows = []
    for name in available_tasks(suite):
        kind, spec = _lookup(name)
        rows.append({
            "task": name, "suite": kind, "metric": spec.metric_name,
            "max_new_tokens": getattr(spec, "max_new_tokens", None),
            "source": spec.hub["path"] if isinstance(getattr(spec, "hub", None), dict) else
            TASKS.origin(name) if isinstance(spec, Task) else _SUITE_TABLE[kind].source,
            "missing": missing_dependency(kind),
        })
    return rows


def check_context_length(task, model_max, context_length: int | None) -> None:
    """TaskError if ``context_length`` cannot be held by the model or leaves no room for the prompt.

    ``task`` is a Task or a task name; ``model_max`` an int (maximum tokens), a tokenizer
    (``model_max_length``), a model (``config.max_position_embeddings``) or None (unknown).
    """
    # lazy: a suite's modules load when one of its tasks is used (its optional extra may be missing)
    from .ruler.task import check_fits, tokenizer_max_length

    if isinstance(task, str):
        task = get_task(task)
    if model_max is None or isinstance(model_max, int):
        limit = model_max
    else:
        config = getattr(model_max, "config", None)
        limit = getattr(config, "max_position_embeddings", None) if config is not None else None
        if limit is None:
            limit = tokenizer_max_length(model_max)
    check_fits(task, limit, context_length)
