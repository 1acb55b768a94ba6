"""Score tables of a run and their export formats: Markdown, CSV, LaTeX (for a paper) and JSON.

The tables follow RESULTS.md (tables.py): one Method x Task table per model and budget, the
uncompressed ``full`` row first as the reference, an Avg column, the best compressed result of
each column in bold. Several seeds of one cell are averaged and shown with the half-width of
their 95% confidence interval. CSV and JSON add a tidy one-row-per-record view for analysis.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import fmean

from tabulate import tabulate

from pytest_kvbench.comparison.stats import seed_summary
from pytest_kvbench.results.runs import is_scored

FULL = "full"
FORMATS = ("md", "csv", "latex", "json")


class ExportError(ValueError):
    """Nothing exportable (for example a run whose items all errored)."""


# -- labels -----------------------------------------------------------------------------------


def _key_parts(record: dict) -> list[str]:
    parts = str(record.get("key", "")).split("|")
    return parts if len(parts) == 5 else []


def method_label(record: dict) -> str:
    """The method as the grid named it, with the parameters the user set: ``snapkv(window=64)``."""
    parts = _key_parts(record)
    if parts:
        return parts[1]
    return (record.get("item_id") or "").split("-")[0] or record["method"]["name"]


def task_label(record: dict) -> str:
    task = record["task"]
    ctx = task.get("context_length")
    return f"{task['name']}@{ctx}" if ctx else task["name"]


def budget_label(record: dict) -> str:
    return str(record["budget"].get("spec"))


def config_key(record: dict) -> str:
    """The item key without its seed: what repeated runs over several seeds have in common."""
    key = str(record.get("key", ""))
    suffix = f"|seed{record.get('seed')}"
    return key.removesuffix(suffix)


# -- the score tables -------------------------------------------------------------------------


@dataclass
class Cell:
    """One (method, task) cell: a score per seed, summarised as mean and 95% interval."""

    values: list[float]

    @property
    def mean(self) -> float:
        return fmean(self.values)

    @property
    def half_width(self) -> float | None:
        if len(self.values) < 2:
            return None
        _, low, high = seed_summary(self.values)
        return (high - low) / 2


@dataclass
class ScoreTable:
    """Method x Task for one model and budget."""

    model: str
    budget: str
    tasks: list[str]
    methods: list[str]
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)

    def value(self, method: str, column: str) -> float | None:
        """Mean score of a cell, or the method's average over all tasks for the ``Avg`` column."""
        if column == "Avg":
            means = [self.cells[(method, t)].mean for t in self.tasks if (method, t) in self.cells]
            return fmean(means) if means and len(means) == len(self.tasks) else None
        cell = self.cells.get((method, column))
        return cell.mean if cell else None

    @property
    def columns(self) -> list[str]:
        return self.tasks + ["Avg"]

    def best(self, column: str) -> float | None:
        """Best compressed value of a column; None when there is no contest (fewer than two
        compressed methods, or all of them equal: bold on every row would say nothing)."""
        compressed = [m for m in self.methods if m != FULL]
        values = [v for m in compressed if (v := self.value(m, column)) is not None]
        if len(values) < 2 or max(values) == min(values):
            return None
        return max(values)

    def is_best(self, method: str, column: str) -> bool:
        value, best = self.value(method, column), self.best(column)
        return method != FULL and value is not None and best is not None and math.isclose(value, best)

    @property
    def seeds_per_cell(self) -> int:
        return max((len(c.values) for c in self.cells.values()), default=0)


def _budget_order(spec: str) -> tuple[int, float, str]:
    try:
        return (1, -float(spec[1:]), spec) if spec.startswith("r") else (0, float(spec), spec)
    except ValueError:
        return (2, 0.0, spec)


def _task_order(records: list[dict]) -> list[str]:
    seen: dict[str, tuple] = {}
    for r in records:
        seen.setdefault(task_label(r), (r["task"].get("suite") or "", r["task"]["name"], r["task"].get("context_length") or 0))
    return sorted(seen, key=lambda label: seen[label])


def score_tables(records: Iterable[dict]) -> list[ScoreTable]:
    """One table per (model, budget) from the scored records; ``full`` rows join every budget."""
    scored = [r for r in records if is_scored(r)]
    models: list[str] = []
    for r in scored:
        if r["model"]["name"] not in models:
            models.append(r["model"]["name"])
    tables = []
    for model in models:
        mine = [r for r in scored if r["model"]["name"] == model]
        budgets = sorted({budget_label(r) for r in mine if budget_label(r) != FULL}, key=_budget_order) or [FULL]
        for budget in budgets:
            rows = [r for r in mine if budget_label(r) in (budget, FULL)]
            methods = sorted({method_label(r) for r in rows}, key=lambda m: (m != FULL, m))
            table = ScoreTable(model, budget, _task_order(rows), methods)
            for r in rows:
                table.cells.setdefault((method_label(r), task_label(r)), Cell([])).values.append(float(r["score"]))
            tables.append(table)
    return tables


def _require_tables(records: Sequence[dict]) -> list[ScoreTable]:
    tables = score_tables(records)
    if not tables:
        raise ExportError("nothing to export: no item of the run has a score")
    return tables


def cell_text(table: ScoreTable, method: str, column: str, pm: str = " ± ") -> str:
    value = table.value(method, column)
    if value is None:
        return "-"
    text = f"{value:.2f}"
    cell = table.cells.get((method, column))
    if cell is not None and cell.half_width is not None:
        text += f"{pm}{cell.half_width:.2f}"
    return text


def table_heading(table: ScoreTable) -> str:
    return f"{table.model} — " + ("full cache" if table.budget == FULL else f"budget {table.budget}")


# -- formats ----------------------------------------------------------------------------------


def to_markdown(records: Sequence[dict], title: str | None = None) -> str:
    lines = [f"# {title}", ""] if title else []
    for table in _require_tables(records):
        rows = []
        for method in table.methods:
            cells = []
            for column in table.columns:
                text = cell_text(table, method, column)
                cells.append(f"**{text}**" if table.is_best(method, column) else text)
            rows.append([method] + cells)
        lines += [f"## {table_heading(table)}", "",
                  tabulate(rows, headers=["Method"] + table.columns, tablefmt="github", disable_numparse=True), ""]
        if table.seeds_per_cell > 1:
            lines += [f"Mean over {table.seeds_per_cell} seeds ± half-width of the 95% confidence interval.", ""]
    return "\n".join(lines)


_LATEX_SPECIAL = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
                  "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def to_latex(records: Sequence[dict], caption: str | None = None) -> str:
    """One booktabs table per model, budgets as row groups, best compressed result per column bold."""
    tables = _require_tables(records)
    out = ["% Generated by kvbench export; requires \\usepackage{booktabs}"]
    for model in dict.fromkeys(t.model for t in tables):
        mine = [t for t in tables if t.model == model]
        tasks = list(dict.fromkeys(task for t in mine for task in t.tasks))
        columns = tasks + ["Avg"]
        seeds = max(t.seeds_per_cell for t in mine)
        text = latex_escape(caption or f"Scores of KV-cache compression methods on {model} (task metric x 100).")
        if seeds > 1:
            text += f" Mean over {seeds} seeds $\\pm$ half-width of the 95\\% confidence interval."
        text += " Best compressed result per column and budget in bold."
        out += [
            "\\begin{table}[t]",
            "\\centering",
            f"\\caption{{{text}}}",
            f"\\label{{tab:kvbench-{''.join(ch if ch.isalnum() else '-' for ch in model).strip('-')}}}",
            f"\\begin{{tabular}}{{ll{'r' * len(columns)}}}",
            "\\toprule",
            " & ".join(["Budget", "Method"] + [latex_escape(c) for c in columns]) + " \\\\",
        ]
        # the uncompressed reference is the same at every budget: print it once, on top
        groups = [(FULL, mine[0], [FULL])] if FULL in mine[0].methods else []
        groups += [(t.budget, t, [m for m in t.methods if m != FULL]) for t in mine if t.budget != FULL]
        for budget, table, methods in groups:
            out.append("\\midrule")
            for index, method in enumerate(methods):
                cells = []
                for column in columns:
                    cell = cell_text(table, method, column, pm="$\\pm$") if column in table.columns else "-"
                    cells.append(f"\\textbf{{{cell}}}" if table.is_best(method, column) else cell)
                label = ("--" if budget == FULL else latex_escape(budget)) if index == 0 else ""
                out.append(" & ".join([label, latex_escape(method)] + cells) + " \\\\")
        out += ["\\bottomrule", "\\end{tabular}", "\\end{table}", ""]
    return "\n".join(out)


TIDY_COLUMNS = [
    "run_id", "key", "model", "method", "method_params", "budget", "budget_kind", "budget_value", "task", "suite",
    "context_length", "seed", "protocol", "metric", "score", "n_samples", "status", "latency_total_s",
    "prefill_ms", "decode_tokens_per_s", "peak_bytes", "kv_bytes_before", "kv_bytes_after", "compression_ratio",
    "kl", "agreement", "energy_j",
]


def tidy_row(record: dict) -> dict:
    """One flat row per record: the shape pandas, R and spreadsheets want."""
    latency = record.get("latency") or {}
    memory = record.get("memory") or {}
    fidelity = record.get("fidelity") or {}
    return {
        "run_id": record.get("run_id"), "key": record.get("key"), "model": record["model"].get("name"),
        "method": record["method"].get("name"),
        "method_params": json.dumps(record["method"].get("params") or {}, sort_keys=True),
        "budget": record["budget"].get("spec"), "budget_kind": record["budget"].get("kind"),
        "budget_value": record["budget"].get("value"), "task": record["task"].get("name"),
        "suite": record["task"].get("suite"), "context_length": record["task"].get("context_length"),
        "seed": record.get("seed"), "protocol": record.get("protocol"), "metric": record.get("metric"),
        "score": record.get("score"), "n_samples": record.get("n_samples"), "status": record.get("status"),
        "latency_total_s": latency.get("total_s"), "prefill_ms": latency.get("prefill_ms"),
        "decode_tokens_per_s": latency.get("decode_tokens_per_s"), "peak_bytes": memory.get("peak_bytes"),
        "kv_bytes_before": memory.get("kv_bytes_before"), "kv_bytes_after": memory.get("kv_bytes_after"),
        "compression_ratio": memory.get("compression_ratio"), "kl": fidelity.get("kl"),
        "agreement": fidelity.get("agreement"), "energy_j": record.get("energy_j"),
    }


def to_csv(records: Sequence[dict]) -> str:
    if not records:
        raise ExportError("nothing to export: the run has no records")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=TIDY_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for record in records:
        writer.writerow({k: ("" if v is None else v) for k, v in tidy_row(record).items()})
    return buffer.getvalue()


def _finite(value):
    """JSON has no NaN/Infinity: undefined numbers (one seed's interval, a NaN KL) become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def to_json(records: Sequence[dict], run_id: str | None = None, environment: dict | None = None) -> str:
    tables = []
    for table in score_tables(records):
        rows = []
        for method in table.methods:
            cells = {}
            for task in table.tasks:
                cell = table.cells.get((method, task))
                if cell:
                    mean, low, high = seed_summary(cell.values)
                    cells[task] = {"mean": round(mean, 4), "low": _finite(low), "high": _finite(high),
                                   "seeds": len(cell.values)}
            rows.append({"method": method, "cells": cells, "avg": _finite(table.value(method, "Avg")),
                         "best": [c for c in table.columns if table.is_best(method, c)]})
        tables.append({"model": table.model, "budget": table.budget, "tasks": table.tasks, "rows": rows})
    if not records:
        raise ExportError("nothing to export: the run has no records")
    payload = {"run_id": run_id, "environment": environment or {}, "tables": tables,
               "records": [{k: _finite(v) for k, v in tidy_row(r).items()} for r in records]}
    return json.dumps(payload, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def export_records(records: Sequence[dict], fmt: str, *, run_id: str | None = None,
                   environment: dict | None = None) -> str:
    """Dispatch on the format name given on the command line."""
    if fmt == "md":
        return to_markdown(records, title=f"Run {run_id}" if run_id else None)
    if fmt == "csv":
        return to_csv(records)
    if fmt == "latex":
        return to_latex(records)
    if fmt == "json":
        return to_json(records, run_id, environment)
    raise ExportError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
