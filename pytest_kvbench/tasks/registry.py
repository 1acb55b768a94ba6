"""Task names -> task objects. Building a task loads nothing and imports no heavy library,
so collecting thousands of items stays fast; data and metrics load when first used."""

from __future__ import annotations

import difflib
import functools

from .base import Task
from .errors import TaskError

SUITES = ("longbench", "ruler")

# Quick tasks for a smoke run, and the embedded-model main job: the retrieval-style RULER tasks
# that need no external text (what the embedded model was trained for) plus the short-answer
# LongBench tasks that have packaged fixtures. Aggregation tasks (cwe, fwe) and long-generation
# tasks (gov_report, samsum, qasper) are available by name; they cost minutes on a CPU and the
# embedded model cannot do them, so they are not in the default grid.
SMOKE_TASKS = ("niah_single_1", "passage_retrieval_en")
DEFAULT_TASKS = (
    "niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt",
    "passage_retrieval_en", "hotpotqa", "trec", "lcc",
)


@functools.cache
def _specs() -> dict[str, tuple[str, object]]:
    from .longbench.config import longbench_specs
    from .ruler.specs import ruler_specs

    specs: dict[str, tuple[str, object]] = {}
    for name, spec in longbench_specs().items():
        specs[name] = ("longbench", spec)
    for name, spec in ruler_specs().items():
        specs[name] = ("ruler", spec)
    return specs


def available_tasks(suite: str | None = None) -> list[str]:
    if suite is not None and suite not in SUITES:
        raise TaskError(f"unknown suite {suite!r}; valid suites: {', '.join(SUITES)}")
    return [name for name, (kind, _) in _specs().items() if suite is None or kind == suite]


def get_task(name: str) -> Task:
    entry = _specs().get(name)
    if entry is None:
        names = list(_specs())
        close = difflib.get_close_matches(str(name), names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TaskError(f"unknown task {name!r}{hint}; valid tasks: {', '.join(names)}")
    kind, spec = entry
    if kind == "longbench":
        from .longbench.task import LongBenchTask

        return LongBenchTask(spec)
    from .ruler.task import RulerTask

    return RulerTask(spec)


def check_context_length(task, model_max, context_length: int | None) -> None:
    """TaskError if ``context_length`` cannot be held by the model or leaves no room for the prompt.

    ``task`` is a Task or a task name; ``model_max`` an int (maximum tokens), a tokenizer
    (``model_max_length``), a model (``config.max_position_embeddings``) or None (unknown).
    """
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
