"""The benchmark record: one item's result, its fields, and what every reader may ask of it.

A record is made once per item (engine/runner.py measures it, ``identity`` names it), finished
once (``with_outcome`` attaches status, message, node id and the gate's verdict in the pytest
report hook), appended to ``records.jsonl`` and read back by every view: RESULTS.md, the terminal
summary, ``kvbench show/export/report/compare`` and baselines. Records stay plain JSON dicts on
disk and in the ``pytest_kvbench_record`` hook (users implement it, files from older runs must
read back), so ``Record`` types them instead of wrapping them.

Every view labels a record from its comparison key (``model|method|budget|task@ctx|seedN``),
never by splitting the item id: method labels may contain hyphens (``my-a``), ids join their
parts with hyphens.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, TypedDict

from kvmethods import Budget, MethodError
from pytest_kvbench.cases import DEFAULT_PROTOCOL, PROTOCOL_PREFIX
from pytest_kvbench.model_sources.gguf_file import gguf_label, looks_like_gguf

FINISHED = ("passed", "failed")  # statuses of items that ran to the end and produced a score
STATUSES = FINISHED + ("skipped", "error")


def budget_sort_key(spec: str) -> tuple:
    """The one budget order: full first, then token budgets ascending, then ratios by kept fraction.

    ``Budget.sort_key`` defines it; a record's spec is parsed the same way the grid parses it.
    """
    try:
        return Budget.parse(spec).sort_key + ("",)
    except MethodError:
        return (3, 0.0, str(spec))  # a spec this version cannot parse (an old or hand-made file): last


class Record(TypedDict, total=False):
    """The fields of a record (DEVELOPERS.md, *Contract: records*, says what each holds)."""

    run_id: str
    nodeid: str
    item_id: str  # the pytest parametrize id, for people; never parsed
    key: str  # the comparison key: resume, dedup, baselines and labels use it
    status: str  # one of STATUSES
    message: str
    verdict: dict | None  # the gate's Verdict.as_dict() with --kvbench-compare
    device: dict  # engine/device_description.describe_device: GPU name and driver, or CPU model
    model: dict
    method: dict  # {name, params}
    budget: dict  # {spec, kind, value}
    protocol: str
    max_prompt_tokens: int | None  # --kvbench-max-prompt-tokens; None: the model's maximum
    seed: int
    task: dict  # {name, suite, metric, context_length, history (SCBench: gold | model)}
    metric: str | None
    score: float | None
    aggregate: dict
    n_samples: int
    samples: list[dict]
    latency: dict
    memory: dict
    fidelity: dict
    energy_j: float | None
    energy_source: str | None
    # what the meter (memory, energy_j, latency.total_s) saw beyond the item's own decoding, under a shared
    # prefill: {decoded_for_other_items: n, decoded_in_other_items: m} (sample decodes; engine/group_decode.py)
    meter_scope: dict
    merged_from_run: str  # set by ``kvbench merge``
    crashed: bool  # set on the error record of an item whose xdist worker died


class Labels(NamedTuple):
    """How a record is named in tables and folders; all parts come from its key."""

    model: str
    method: str  # as the grid spelled it, with the parameters the user set: snapkv(window=64)
    budget: str  # budget spec, or "full"
    task: str  # task name, with @context_length for RULER: niah_single_1@4096
    seed: str  # seedN
    protocol: str = DEFAULT_PROTOCOL


def labels(record: dict) -> Labels:
    """The record's labels, parsed from its key ``model|method|budget|task@ctx|seedN[|protocol=P]``.

    Model ids and method labels may contain anything but the last three fields cannot hold a
    ``|``, so the key is cut from the right (after a trailing protocol part); the model is the first
    field, the method the rest. A record without a well-formed key (hand-made) falls back to its fields.
    """
    parts = str(record.get("key") or "").split("|")
    protocol = DEFAULT_PROTOCOL
    if parts[-1].startswith(PROTOCOL_PREFIX):
        protocol = parts.pop()[len(PROTOCOL_PREFIX):]
    if len(parts) >= 5:
        return Labels(parts[0], "|".join(parts[1:-3]), parts[-3], parts[-2], parts[-1], protocol)
    task = record.get("task") or {}
    ctx = task.get("context_length")
    return Labels(str((record.get("model") or {}).get("name")), str((record.get("method") or {}).get("name")),
                  str((record.get("budget") or {}).get("spec")),
                  f"{task.get('name')}@{ctx}" if ctx else str(task.get("name")), f"seed{record.get('seed')}",
                  str(record.get("protocol") or DEFAULT_PROTOCOL))


def model_title(record: dict) -> str:
    """The model as tables title it: the key's model, and for a GGUF-derived one the file and its
    quantization (``smollm2-135m: SmolLM2-135M-Instruct (GGUF Q4_1)``), so that its rows are never
    taken for the float model's. Records without ``model.gguf`` (all older ones) keep the key's name."""
    name = labels(record).model
    gguf = (record.get("model") or {}).get("gguf")
    if not isinstance(gguf, dict) or not gguf.get("file") or not gguf.get("quantization"):
        return name
    label = gguf_label(str(gguf["file"]), str(gguf["quantization"]))
    return label if looks_like_gguf(name) else f"{name}: {label}"


def is_number(value: object) -> bool:
    """A finite int or float (not a bool): what JSON may hold where a measurement goes."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_scored(record: dict) -> bool:
    """A record with a finite numeric score: only these can be tabulated, saved or compared."""
    return is_number(record.get("score"))


def is_finished(record: dict) -> bool:
    """An item that ran to the end (passed, or failed a check after producing its result)."""
    return record.get("status") in FINISHED


def identity(case: Any, run_id: str, protocol: str) -> dict:
    """The fields every record has, known from its case before the item runs (skipped and
    errored items have only these)."""
    return {
        "run_id": run_id,
        "item_id": case.id,
        "key": case.key,
        "model": {"name": case.model},
        "method": {"name": case.method.name, "params": dict(case.method.params)},
        "budget": case.budget.as_record(),
        "protocol": protocol,
        "seed": case.seed,
        "task": {"name": case.task, "suite": case.suite, "context_length": case.context_length},
        "metric": None,
        "score": None,
        "samples": [],
    }


def with_outcome(record: dict, *, status: str, nodeid: str, message: str | None = None,
                 verdict: dict | None = None) -> dict:
    """The finished record: pytest's outcome, and the gate's verdict when it judged the item."""
    if status not in STATUSES:
        raise ValueError(f"record status must be one of {', '.join(STATUSES)}, got {status!r}")
    finished = dict(record, nodeid=nodeid, status=status)
    if message:
        finished["message"] = message
    if verdict is not None:
        finished["verdict"] = verdict
    return finished
