"""The benchmark record: one item's result, typed, and what every reader may ask of it.

A record is made once per item (``Record.identity`` names it, engine/runner.py measures it), finished
once (``Record.finished`` attaches status, message, node id and the gate's verdict in the pytest report
hook), appended to ``records.jsonl`` and read back by every view: RESULTS.md, the terminal summary,
``kvbench show/export/report/compare`` and baselines. In memory it is a ``Record`` read through
attributes; on disk and in the ``pytest_kvbench_record`` hook it stays a plain JSON dict (users implement
the hook, files from older runs must read back): ``Record.to_json`` / ``Record.from_json`` convert, the
latter migrating older schema versions (record/schema.py).

Every view labels a record from its key (``record.labels``, record_key.py), never by splitting the item id.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from kvmethods import Budget, MethodError
from pytest_kvbench.model_sources.gguf_file import gguf_label, looks_like_gguf
from pytest_kvbench.results.record.serializer import OMITTED_AT_DEFAULT, RecordShapeError, from_json, to_json
from pytest_kvbench.record_key import DEFAULT_PROTOCOL, DEFAULT_SLIDING, ItemKey, task_label
from pytest_kvbench.results.record.schema import SCHEMA_VERSION, RecordVersionError, migrate

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


HALF_DTYPES = ("bfloat16", "float16")  # dtypes a table's model title names (float32 is the CPU's default)


# -- the typed record -------------------------------------------------------------------------
# Each part is a small frozen dataclass; ``extra`` keeps the keys a part does not declare (a newer or
# hand-made file), so a record read and written back (``kvbench merge``) loses nothing.


@dataclass(frozen=True, kw_only=True)
class ModelInfo:
    """The model an item ran: its name as the grid gave it, and, once loaded, where it came from."""

    name: str
    source: str | None = None
    revision: str | None = None  # the hub commit sha; None for a local directory
    dtype: str | None = None
    attn_implementation: str | None = None
    family: str | None = None
    device: str | None = None
    load_s: float | None = None
    size_bytes: int | None = None
    max_positions: int | None = None
    loaded_by_this_item: bool | None = None
    # GGUF-derived models only: file, sha256, size_bytes, architecture, quantization, model_name, ...
    gguf: dict | None = field(default=None, metadata=OMITTED_AT_DEFAULT)
    extra: dict = field(default_factory=dict)

    @property
    def gguf_sha256(self) -> str | None:
        """The GGUF file's digest: the same name may load a GGUF file or float weights."""
        return self.gguf.get("sha256") if isinstance(self.gguf, dict) else None


@dataclass(frozen=True, kw_only=True)
class MethodInfo:
    name: str
    params: dict = field(default_factory=dict)  # every parameter with its value, defaults included
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class BudgetInfo:
    spec: str  # "1024" | "r0.5" | "m0.25" | "full"
    kind: str | None = None  # tokens | ratio | memory | none
    value: float | None = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TaskInfo:
    name: str
    suite: str | None = None
    metric: str | None = None
    context_length: int | None = None
    history: str | None = field(default=None, metadata=OMITTED_AT_DEFAULT)  # SCBench: gold | model
    extra: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return task_label(self.name, self.context_length)


@dataclass(frozen=True, kw_only=True)
class Latency:
    prefill_ms: float | None = None
    decode_tokens_per_s: float | None = None
    total_s: float | None = None
    # the method's own decode speed: samples decoded alone (batch 1; decode_tokens_per_s also counts batched
    # samples, whose step times are shared among the batch's members); None when none was
    decode_tokens_per_s_alone: float | None = field(default=None, metadata=OMITTED_AT_DEFAULT)
    # the decode batch shrank after out of memory (the worker's first such); absent otherwise
    decode_batch_note: str | None = field(default=None, metadata=OMITTED_AT_DEFAULT)
    # a serving engine's own timings (serving/): time to first token (its prompt processing) and per output token
    ttft_ms: float | None = field(default=None, metadata=OMITTED_AT_DEFAULT)
    tpot_ms: float | None = field(default=None, metadata=OMITTED_AT_DEFAULT)
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Memory:
    peak_bytes: int | None = None
    kind: str | None = None  # what peak_bytes measured: cuda_allocated, cpu_rss, ...
    peak_method: str | None = None
    peak_reserved_bytes: int | None = None  # CUDA
    kv_bytes_before: float | None = None
    kv_bytes_after: float | None = None
    compression_ratio: float | None = None
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Fidelity:
    kl: float | None = None  # mean KL divergence to the full-cache pass
    agreement: float | None = None  # mean greedy agreement with it
    # mean KL along the greedy decode itself (engine/fidelity.py); absent from records made before it existed
    decode_kl: float | None = field(default=None, metadata=OMITTED_AT_DEFAULT)
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Device:
    """What the item ran on (engine/hardware/device_description.py): GPU name and driver, or CPU model."""

    type: str | None = None
    name: str | None = None
    driver: str | None = None
    cuda_version: str | None = None
    cpu_model: str | None = None
    torch: str | None = None
    count: int | None = None
    memory_bytes: int | None = field(default=None, metadata=OMITTED_AT_DEFAULT)  # CUDA
    threads: int | None = field(default=None, metadata=OMITTED_AT_DEFAULT)  # CPU
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Serving:
    """A serving engine's row (``llamacpp:q8_0``, serving/): what ran and how its cache compares."""

    engine: str  # "llama.cpp"
    version: str | None = None  # the engine's package version (xllamacpp)
    weights: str | None = None  # what the engine runs: the GGUF file's own quantized weights (Q4_1)
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    byte_fraction: float | None = None  # the cache's bytes per token over f16 keys and values (blocks included)
    kv_bytes_reported: int | None = None  # the engine's own size of the cache it allocated (its log)
    kv_bytes_allocated: int | None = None  # the same allocation from the cache types' blocks
    kv_bytes_agree: bool | None = None  # whether the two agree (None: the engine printed no size)
    agreement_engine: float | None = None  # greedy-token agreement with the engine's own f16 cache
    top_n_kl: float | None = None  # KL(engine f16 || this) estimated on the engine's top-n log-probs (docs)
    top_n: int | None = None
    threads: int | None = None
    engine_started: bool | None = None  # this item started the engine (its load time is in no timing)
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class MeterScope:
    """Sample decodes the item's meter (memory, energy, latency.total_s) saw beyond its own (shared prefill)."""

    decoded_for_other_items: int = 0
    decoded_in_other_items: int = 0
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Record:
    """One item's result (DEVELOPERS.md, *Contract: records*, says what each field holds).

    Made by ``Record.identity`` (what the case names) and the runner (what it measured), finished by
    ``finished`` in the pytest report hook; ``to_json`` / ``Record.from_json`` are its one serializer."""

    schema_version: int = SCHEMA_VERSION
    run_id: str | None = None
    nodeid: str | None = field(default=None, metadata=OMITTED_AT_DEFAULT)
    item_id: str | None = None  # the pytest parametrize id, for people; never parsed
    key: str  # the item's identity: resume, dedup, baselines and labels use it (record_key.py)
    status: str | None = field(default=None, metadata=OMITTED_AT_DEFAULT)  # one of STATUSES once finished
    message: str | None = field(default=None, metadata=OMITTED_AT_DEFAULT)
    verdict: dict | None = field(default=None, metadata=OMITTED_AT_DEFAULT)  # the gate's Verdict.as_dict()
    model: ModelInfo
    method: MethodInfo
    budget: BudgetInfo
    protocol: str = DEFAULT_PROTOCOL
    # --kvbench-sliding: "compress" when the method compressed sliding-window layers too (also in the key)
    sliding: str = field(default=DEFAULT_SLIDING, metadata=OMITTED_AT_DEFAULT)
    seed: int | None = None
    task: TaskInfo
    metric: str | None = None
    # what was measured: the task's version and metric, the generation settings (results/record/fingerprint.py)
    benchmark: dict | None = None
    score: float | None = None
    samples: list[dict] = field(default_factory=list)  # per-sample rows, as predictions.jsonl holds them
    device: Device = field(default_factory=Device)
    max_prompt_tokens: int | None = None  # --kvbench-max-prompt-tokens; None: the model's maximum
    aggregate: dict = field(default_factory=dict)  # the task's aggregate: score, and contexts / turns / splits
    n_samples: int | None = None
    latency: Latency = field(default_factory=Latency)
    memory: Memory = field(default_factory=Memory)
    fidelity: Fidelity = field(default_factory=Fidelity)
    energy_j: float | None = None
    energy_source: str | None = None
    meter_scope: MeterScope | None = field(default=None, metadata=OMITTED_AT_DEFAULT)
    serving: Serving | None = field(default=None, metadata=OMITTED_AT_DEFAULT)  # a serving engine's row only
    merged_from_run: str | None = field(default=None, metadata=OMITTED_AT_DEFAULT)  # set by ``kvbench merge``
    crashed: bool = field(default=False, metadata=OMITTED_AT_DEFAULT)  # the error record of a dead xdist worker
    extra: dict = field(default_factory=dict)

    # -- the one serializer ----------------------------------------------------------------------
    def to_json(self) -> dict:
        """The JSON-able dict written to records.jsonl, run.json and passed to the hook."""
        return to_json(self)

    @classmethod
    def from_json(cls, data: object) -> Record:
        """A record of any schema version read back (migrated first); RecordError (one line) when it
        is not a record: not an object, a newer version, no key, a part that is not an object."""
        if not isinstance(data, dict):
            raise RecordError(f"is not a JSON object but {type(data).__name__}")
        try:
            migrated = migrate(data)
        except RecordVersionError as exc:
            raise RecordError(str(exc)) from None
        if not isinstance(migrated.get("key"), str):
            raise RecordError("has no 'key' string")
        for name, inner in (("model", "name"), ("method", "name"), ("budget", "spec"), ("task", "name")):
            part = migrated.get(name)
            if not isinstance(part, dict) or not isinstance(part.get(inner), str):
                raise RecordError(f"has no '{name}' object with a '{inner}'")
        samples = migrated.get("samples", [])
        if not isinstance(samples, list) or not all(isinstance(s, dict) for s in samples):
            raise RecordError("has malformed 'samples' (a list of objects)")
        try:
            return from_json(cls, migrated)
        except RecordShapeError as exc:
            raise RecordError(str(exc)) from None

    # -- made and finished -----------------------------------------------------------------------
    @classmethod
    def identity(cls, case: Any, run_id: str, protocol: str) -> Record:
        """The fields every record has, known from its case before the item runs (skipped and errored
        items have only these)."""
        return cls(run_id=run_id, item_id=case.id, key=case.key, model=ModelInfo(name=case.model),
                   method=MethodInfo(name=case.method.name, params=dict(case.method.params)),
                   budget=from_json(BudgetInfo, case.budget.as_record(), "budget"), protocol=protocol,
                   sliding=getattr(case, "sliding", DEFAULT_SLIDING),
                   seed=case.seed, task=TaskInfo(name=case.task, suite=case.suite, context_length=case.context_length))

    def finished(self, *, status: str, nodeid: str, message: str | None = None,
                 verdict: dict | None = None, item_id: str | None = None) -> Record:
        """The finished record: pytest's outcome, and the gate's verdict when it judged the item; `item_id`: the
        id the item ran under when it is not the case's own (the pytest_kvbench_item_id hook renamed it)."""
        if status not in STATUSES:
            raise ValueError(f"record status must be one of {', '.join(STATUSES)}, got {status!r}")
        return replace(self, nodeid=nodeid, status=status, message=message or self.message,
                       verdict=verdict if verdict is not None else self.verdict, item_id=item_id or self.item_id)

    def with_fields(self, fields: dict) -> Record:
        """This record with fields of a user's own in its ``extra`` (the pytest_kvbench_record_fields hook);
        RecordError (one line) for a key the record declares."""
        declared = sorted(set(fields) & {f.name for f in dataclasses.fields(self)})
        if declared:
            raise RecordError(f"pytest_kvbench_record_fields returned {', '.join(map(repr, declared))}: a field "
                              f"every record declares; name yours otherwise")
        return replace(self, extra={**self.extra, **fields}) if fields else self

    # -- what readers ask ------------------------------------------------------------------------
    @property
    def labels(self) -> ItemKey:
        """The record's labels, parsed from its key; a record without a well-formed key (hand-made)
        falls back to its fields."""
        parsed = ItemKey.parse(self.key)
        if parsed is not None:
            return parsed
        return ItemKey.of(self.model.name, self.method.name, self.budget.spec, self.task.name,
                          self.task.context_length or None, self.seed, self.protocol, self.sliding)

    @property
    def is_scored(self) -> bool:
        """A finite numeric score: only these records can be tabulated, saved or compared."""
        return is_number(self.score)

    @property
    def is_finished(self) -> bool:
        """An item that ran to the end (passed, or failed a check after producing its result)."""
        return self.status in FINISHED

    @property
    def model_title(self) -> str:
        """The model as tables title it: the key's model, and for a GGUF-derived one the file and its
        quantization (``smollm2-135m: SmolLM2-135M-Instruct (GGUF Q4_1)``), so that its rows are never
        taken for the float model's. Records without ``model.gguf`` (all older ones) keep the key's name. A model
        run in half precision says so (``gemma3-270m: ... (bfloat16)``): its rows are not float32's either."""
        name = self.labels.model
        half = f" ({self.model.dtype})" if self.model.dtype in HALF_DTYPES else ""
        gguf = self.model.gguf
        if not isinstance(gguf, dict) or not gguf.get("file") or not gguf.get("quantization"):
            return name + half
        label = gguf_label(str(gguf["file"]), str(gguf["quantization"]))
        return (label if looks_like_gguf(name) else f"{name}: {label}") + half

    @property
    def sample_scores(self) -> list[float]:
        """The per-sample scores that are numbers, in percent (the scale of ``score``)."""
        return [100 * float(s["score"]) for s in self.samples if is_number(s.get("score"))]


class RecordError(ValueError):
    """A JSON value that is not a record this version can read; one line saying what is wrong."""


def is_number(value: object) -> bool:
    """A finite int or float (not a bool): what JSON may hold where a measurement goes."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_whole(value: object) -> bool:
    """An int that is not a bool: what JSON may hold where a count goes."""
    return isinstance(value, int) and not isinstance(value, bool)


def mean_of_present(values: Iterable[object]) -> float | None:
    """The mean of the measurements among `values`, the one mean of record figures (the runner's per-item means of
    its samples, the KV-cache and latency figures, the views' cells): a missing value (None, and anything that is
    not is_number: NaN, inf, a bool, text) is left out, never counted as 0 and never poisoning the mean; None when
    no value is present. Summed left to right, as records have always been."""
    present = [value for value in values if is_number(value)]
    return sum(present) / len(present) if present else None


def superseded(earlier: Record) -> dict:
    """What a re-run item's record keeps of the record it replaces (its ``supersedes`` field)."""
    kept = {"status": earlier.status, "message": earlier.message}
    return kept | ({"crashed": True} if earlier.crashed else {})
