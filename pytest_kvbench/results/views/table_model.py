"""The one table model every view renders: Method x Task per model and budget, as papers print them.

RESULTS.md, the terminal summary, ``kvbench show`` and ``export`` (Markdown, LaTeX, JSON) and the
HTML report all draw ``score_tables``: one table per (model, budget), the uncompressed ``full``
row first as the reference of every budget, an Avg column over tasks, the best compressed result
of each column marked, several seeds of a cell averaged with the half-width of their 95%
interval, and per method the mean fidelity (KL, greedy agreement), KV memory kept (bytes the stored
tensors hold), peak memory and, under a byte budget, the share of the budget used. Rows,
columns and budgets are named from each record's key (results/record/__init__.py) and ordered one way.

A run at several RULER context lengths gets one table per length too, as RULER reports a score per length:
in one table a task run at 16k for three methods would leave the other rows without an Avg, and mix 8k and
16k records in a row's KL and KV MiB.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from statistics import fmean

from kvmethods import FULL_CACHE
from pytest_kvbench.results.record import Record, budget_sort_key, mean_of_present
from pytest_kvbench.record_key import DEFAULT_PROTOCOL
from pytest_kvbench.results.views.suite_summaries import suite_summaries

AVG = "Avg"
MiB = 2**20
TABLE_RESAMPLES = 2_000  # per cell: a printed half-width to two decimals needs no more


@dataclass
class Cell:
    """One (method, task) cell: a score per seed, summarised as mean and 95% interval over seeds;
    ``sample_scores`` (x 100) give one seed's interval, a bootstrap over the item's samples."""

    values: list[float]
    sample_scores: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return fmean(self.values)

    @property
    def half_width(self) -> float | None:
        if len(self.values) < 2:
            return None
        from pytest_kvbench.stats import seed_summary  # lazy for startup time: scipy, only where seeds repeat

        _, low, high = seed_summary(self.values)
        return (high - low) / 2

    @property
    def sample_half_width(self) -> float | None:
        """Half-width of the 95% bootstrap interval of the mean over samples (one seed's spread)."""
        interval = sample_interval(self.sample_scores)
        return (interval[1] - interval[0]) / 2 if interval else None


def sample_interval(sample_scores: list[float]) -> tuple[float, float] | None:
    """The 95% bootstrap interval (low, high) of the mean over one item's sample scores, as the tables print it;
    None under two samples or when the bootstrap gives no finite bounds."""
    if len(sample_scores) < 2:
        return None
    from pytest_kvbench.stats import bootstrap_mean  # lazy for startup time: scipy, only where an interval is shown

    _, low, high = bootstrap_mean(sample_scores, n_resamples=TABLE_RESAMPLES)
    return (low, high) if math.isfinite(low) and math.isfinite(high) else None


@dataclass
class ScoreTable:
    """Method x Task for one model and budget."""

    model: str
    budget: str
    tasks: list[str]
    methods: list[str]
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    records: dict[str, list[Record]] = field(default_factory=dict)  # per method, every record of its row
    protocol: str = DEFAULT_PROTOCOL
    context_length: int | None = None  # set where the model's records ran at several lengths: one table each

    def value(self, method: str, column: str) -> float | None:
        """Mean score of a cell, or the method's average over all tasks for the ``Avg`` column."""
        if column == AVG:
            means = [self.cells[(method, t)].mean for t in self.tasks if (method, t) in self.cells]
            return fmean(means) if means and len(means) == len(self.tasks) else None
        cell = self.cells.get((method, column))
        return cell.mean if cell else None

    @property
    def columns(self) -> list[str]:
        return self.tasks + [AVG]

    def best(self, column: str) -> float | None:
        """Best compressed value of a column; None when there is no contest (fewer than two
        compressed methods, or all of them equal: bold on every row would say nothing)."""
        compressed = [m for m in self.methods if m != FULL_CACHE.spec and not self.is_engine_reference(m)]
        values = [v for m in compressed if (v := self.value(m, column)) is not None]
        if len(values) < 2 or max(values) == min(values):
            return None
        return max(values)

    def is_best(self, method: str, column: str) -> bool:
        value, best = self.value(method, column), self.best(column)
        return (method != FULL_CACHE.spec and not self.is_engine_reference(method) and value is not None
                and best is not None and math.isclose(value, best))

    def is_engine_reference(self, method: str) -> bool:
        """A serving engine's uncompressed row (``llamacpp:f16``): a reference like ``full``, never the best."""
        return any(r.serving is not None and (r.serving.byte_fraction or 0) >= 1.0 for r in self.records.get(method, ()))

    @property
    def seeds_per_cell(self) -> int:
        return max((len(c.values) for c in self.cells.values()), default=0)

    def mean_kl(self, method: str) -> float | None:
        """Mean KL(full || method) over the row's records (nats)."""
        return mean_of_present(r.fidelity.kl for r in self.records[method])

    def mean_agreement(self, method: str) -> float | None:
        return mean_of_present(r.fidelity.agreement for r in self.records[method])

    def mean_kv_mib(self, method: str) -> float | None:
        """Mean KV cache kept after compression, MiB; None when not measured (or zero)."""
        kv = mean_of_present(r.memory.kv_bytes_after for r in self.records[method])
        return kv / MiB if kv else None

    def mean_window_mib(self, method: str) -> float | None:
        """Of the KV MiB, the mean the sliding-window layers hold (sample field kv_bytes_window); None without."""
        window = mean_of_present(s["kv_bytes_window"] for r in self.records[method] for s in r.samples
                          if s.get("kv_bytes_window") is not None)
        return window / MiB if window is not None else None

    @property
    def has_window_layers(self) -> bool:
        return any(s.get("kv_bytes_window") is not None for rs in self.records.values() for r in rs for s in r.samples)

    def decode_tokens_per_s(self, method: str) -> float | None:
        """The method's own decode speed: tokens per second of its samples decoded alone (batch 1), mean over the
        row's records; records from before batched decoding give their decode_tokens_per_s (all alone then). A
        record whose samples all decoded in batches (--kvbench-measure-alone method: its method's speed was
        measured on another item) adds nothing: a batch's speed is not the method's own."""
        return mean_of_present(r.latency.decode_tokens_per_s_alone if r.latency.decode_tokens_per_s_alone is not None
                               else None if _batched(r) else r.latency.decode_tokens_per_s
                               for r in self.records[method])

    @property
    def has_engine_rows(self) -> bool:
        """Whether a serving engine's row (``llamacpp:q8_0``) is in the table: then TTFT and TPOT are shown."""
        return any(r.serving is not None for rs in self.records.values() for r in rs)

    def ttft_ms(self, method: str) -> float | None:
        """Time to first token: an engine's own (its prompt processing), a method's prefill."""
        return mean_of_present(r.latency.ttft_ms if r.latency.ttft_ms is not None else r.latency.prefill_ms
                        for r in self.records[method])

    def tpot_ms(self, method: str) -> float | None:
        """Time per output token: an engine's own, a method's 1 / its own decode speed."""
        engine = mean_of_present(r.latency.tpot_ms for r in self.records[method])
        if engine is not None:
            return engine
        speed = self.decode_tokens_per_s(method)
        return 1000.0 / speed if speed else None

    def mean_peak_mib(self, method: str) -> float | None:
        """Mean peak memory of the row's items (CPU resident or CUDA allocated, reset per item), MiB."""
        peak = mean_of_present(r.memory.peak_bytes for r in self.records[method])
        return peak / MiB if peak else None

    @property
    def is_byte_budget(self) -> bool:
        return self.budget.startswith("m")

    def budget_use(self, method: str) -> float | None:
        """Mean over samples of the bytes stored / the bytes a byte budget allows (above 1: over budget)."""
        return mean_of_present(s["kv_bytes_physical"] / s["kv_bytes_budget"] for r in self.records[method]
                        for s in r.samples if s.get("kv_bytes_budget") and s.get("kv_bytes_physical"))

    def records_by_task(self) -> dict[str, dict[str, list[Record]]]:
        """The table's records as ``{method: {task label: [records]}}``: what a suite's summary
        (results/views/suite_summaries.py) reads."""
        grouped: dict[str, dict[str, list[Record]]] = {}
        for method, records in self.records.items():
            for r in records:
                grouped.setdefault(method, {}).setdefault(r.labels.task, []).append(r)
        return grouped

    def summaries(self) -> list:
        """The suite summaries (LongBench v2 splits, InfiniteBench columns) of this table's records."""
        return suite_summaries(self.records_by_task())

    @property
    def heading(self) -> str:
        heading = f"{self.model} — " + ("full cache" if self.budget == FULL_CACHE.spec else f"budget {self.budget}")
        if self.context_length is not None:
            heading += f" — {self.context_length:,} tokens"
        return heading if self.protocol == DEFAULT_PROTOCOL else f"{heading} — protocol {self.protocol}"


def cell_text(table: ScoreTable, method: str, column: str, pm: str | None = " ± ", over_samples: bool = False) -> str:
    """A cell as printed: the mean to two decimals, ``± half-width`` of its 95% interval when several
    seeds ran (``over_samples``: else a bootstrap over the samples of its one seed; ``pm=None``: the mean alone)."""
    value = table.value(method, column)
    if value is None:
        return "-"
    text = f"{value:.2f}"
    cell = table.cells.get((method, column))
    half_width = None if cell is None or pm is None else cell.half_width
    if half_width is None and over_samples and cell is not None and pm is not None:
        half_width = cell.sample_half_width
    if half_width is not None:
        text += f"{pm}{half_width:.2f}"
    return text


def _task_order(label: str) -> tuple[str, int]:
    """Tasks by name, then context length as a number (niah@4096 before niah@16384)."""
    return (label.partition("@")[0], context_length(label) or 0)


def context_length(label: str) -> int | None:
    """The context length of a task label (``niah_single_2@16384`` -> 16384), None for a task without one."""
    name, _, ctx = label.partition("@")
    return int(ctx) if name and ctx.isdigit() else None


def _memory_fraction(budget: str) -> float | None:
    try:
        return float(budget[1:]) if budget.startswith("m") else None
    except ValueError:
        return None


def joins_table(record: Record, budget: str, budgets: list[str]) -> bool:
    """Whether a row run once per task (budget ``full``) joins this budget's table. ``full`` and an engine's
    reference (``llamacpp:f16``) join every one; an engine's quantized cache joins the byte budget nearest its byte
    fraction (q8_0: 0.53 -> m0.5), the table it is compared in without being that budget, or every table when the
    run has no byte budget."""
    fraction = record.serving.byte_fraction if record.serving is not None else None
    memory = {b: f for b in budgets if (f := _memory_fraction(b)) is not None}
    if fraction is None or fraction >= 1.0 or not memory:
        return True
    return budget == min(memory, key=lambda b: (abs(memory[b] - fraction), memory[b]))


def score_tables(records: Iterable[Record]) -> list[ScoreTable]:
    """One table per (model, protocol, budget) from the scored records; ``full`` rows join every budget (an
    engine's quantized cache the byte budget nearest its size: joins_table)."""
    scored = [(r.labels, r.model_title, r) for r in records if r.is_scored]
    settings = list(dict.fromkeys((title, label.protocol) for label, title, _ in scored))
    tables = []
    for model, protocol in settings:
        model_records = [(label, r) for label, title, r in scored if (title, label.protocol) == (model, protocol)]
        lengths = sorted({context_length(label.task) for label, _ in model_records}, key=lambda n: (n is None, n or 0))
        if len([n for n in lengths if n is not None]) < 2:  # one RULER length (beside tasks without one): one table
            tables += _budget_tables(model, protocol, model_records, None)
            continue
        for length in lengths:  # tasks without a length (LongBench beside RULER) get their own table, unlabelled
            mine = [(label, r) for label, r in model_records if context_length(label.task) == length]
            tables += _budget_tables(model, protocol, mine, length)
    return tables


def _budget_tables(model: str, protocol: str, mine: list, length: int | None) -> list[ScoreTable]:
    budgets = sorted({label.budget for label, _ in mine if label.budget != FULL_CACHE.spec}, key=budget_sort_key) or [FULL_CACHE.spec]
    tables = []
    for budget in budgets:
        rows = [(label, r) for label, r in mine
                if label.budget == budget or (label.budget == FULL_CACHE.spec and joins_table(r, budget, budgets))]
        methods = sorted({label.row for label, _ in rows}, key=lambda m: (m != FULL_CACHE.spec, m))
        tasks = sorted({label.task for label, _ in rows}, key=_task_order)
        table = ScoreTable(model, budget, tasks, methods, protocol=protocol, context_length=length)
        for label, r in rows:
            cell = table.cells.setdefault((label.row, label.task), Cell([]))
            cell.values.append(float(r.score))
            cell.sample_scores += r.sample_scores
            table.records.setdefault(label.row, []).append(r)
        tables.append(table)
    return tables


def _batched(record) -> bool:
    """Whether any sample of the record was decoded in a batch (decode_batch above 1)."""
    return any((sample.get("decode_batch") or 1) > 1 for sample in record.samples)
