"""The plots of a run report, as matplotlib Figures (no pyplot global state).

Average score against KV memory, a task x method heatmap, the needle-in-a-haystack depth x context
length heatmap when ``niah_grid`` records are present, and (for ``kvbench variance``) coefficient of
variation against seeds; the plots against budget are in report/budget_figures.py. Tasks whose full cache
scores 0 are left out of the plots (``with_signal``): the report names them in one line instead. Figures are made
through ``Figure`` objects only, so this is safe from a pytest session or a thread; html_report.py
inlines them as SVG, and ``save_figure`` writes one to a file.
"""

from __future__ import annotations

import io
import math
import os
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean
from typing import TYPE_CHECKING

from kvmethods import FULL_CACHE
from pytest_kvbench.results.views.needle_grid import needle_grids
from pytest_kvbench.results.record import Record
from pytest_kvbench.stats import VariationCurve

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MiB = 2**20


class ReportError(ValueError):
    """A report that cannot be produced (nothing scored) or written."""


def new_figure(width: float, height: float) -> Figure:
    # lazy for startup time: matplotlib, only when a figure is drawn
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def figure_svg(fig: Figure, salt: str) -> str:
    """The figure as an inline ``<svg>`` element; ``salt`` keeps ids unique across figures of a page."""
    # lazy for startup time: matplotlib
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def plot_format(path: str | os.PathLike) -> str:
    """The file format a plot path asks for by its extension (none: png); ReportError for another one."""
    suffix = Path(path).suffix.lower().lstrip(".") or "png"
    if suffix not in ("png", "svg", "pdf"):
        raise ReportError(f"cannot write plot {path}: use a .png, .svg or .pdf file name")
    return suffix


def save_figure(fig: Figure, path: str | os.PathLike) -> None:
    """Write a figure to a file whose extension picks the format (png, svg, pdf)."""
    target = Path(path)
    suffix = plot_format(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        fig.savefig(tmp, format=suffix, metadata={"Date": None} if suffix == "svg" else None)
        os.replace(tmp, target)
    except OSError as exc:
        raise ReportError(f"cannot write plot {target}: {exc.strerror or exc}") from None


def series_label(record: Record, several_models: bool) -> str:
    label = record.labels.method
    return f"{record.model.name}: {label}" if several_models else label


def palette(records: Sequence[Record]) -> dict[str, str]:
    """One colour per series for the whole page, so a method looks the same in every plot."""
    # lazy for startup time: matplotlib
    from matplotlib import colormaps

    several_models = len({r.model.name for r in records}) > 1
    labels = sorted({series_label(r, several_models) for r in records})
    colours = colormaps["tab10"].colors + colormaps["Dark2"].colors
    return {label: colours[i % len(colours)] for i, label in enumerate(labels)}


def _silent_tasks(records: Sequence[Record]) -> set[tuple[str, str]]:
    """(model, task label) pairs whose full cache scored 0 in every record: every method scores 0 there
    too, so a plot of them is a flat line that says nothing about the methods."""
    full: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in records:
        if r.is_scored and r.labels.budget == FULL_CACHE.spec:
            full[(r.model.name, r.labels.task)].append(float(r.score))
    return {pair for pair, scores in full.items() if not any(scores)}


def tasks_without_signal(records: Sequence[Record]) -> list[str]:
    """The tasks whose full cache scores 0, as the report names them ("model: task" when several models)."""
    several_models = len({r.model.name for r in records}) > 1
    return sorted(f"{model}: {task}" if several_models else task for model, task in _silent_tasks(records))


def with_signal(records: Sequence[Record]) -> list[Record]:
    """The records of tasks that have something to show (tasks_without_signal left out)."""
    silent = _silent_tasks(records)
    return [r for r in records if (r.model.name, r.labels.task) not in silent]


def memory_figure(records: Sequence[Record]) -> Figure | None:
    """Average score over tasks against mean KV memory kept, one line per method across budgets."""
    several_models = len({r.model.name for r in records if r.is_scored}) > 1
    by_config: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for r in records:
        kv = r.memory.kv_bytes_after
        if r.is_scored and isinstance(kv, (int, float)) and kv > 0:
            by_config[(series_label(r, several_models), r.labels.budget)].append(r)
    if not by_config:
        return None
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (label, _budget), group in by_config.items():
        per_task: dict[str, list[float]] = defaultdict(list)
        for r in group:
            per_task[r.labels.task].append(float(r.score))
        average = fmean(fmean(v) for v in per_task.values())
        memory = fmean(float(r.memory.kv_bytes_after) for r in group) / MiB
        series[label].append((memory, average))
    colours = palette([r for r in records if r.is_scored])
    fig = new_figure(7.0, 4.5)
    ax = fig.subplots()
    for label, xy in sorted(series.items()):
        xy.sort()
        ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=label, color=colours[label])
    # lazy for startup time: matplotlib
    from matplotlib.ticker import FormatStrFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(FormatStrFormatter("%g"))
    ax.tick_params(axis="x", which="minor", labelsize="x-small")
    ax.set_xlabel("KV cache kept (MiB, mean over samples and tasks)")
    ax.set_ylabel("average score over tasks")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


def heatmap_figure(records: Sequence[Record]) -> Figure | None:
    """Task x method (at each budget) mean score, annotated, one panel per model."""
    scored = [r for r in records if r.is_scored]
    if not scored:
        return None
    models = list(dict.fromkeys(r.model.name for r in scored))
    fig = None
    grids = []
    for model in models:
        mine = [r for r in scored if r.model.name == model]
        cells: dict[tuple[str, str], list[float]] = defaultdict(list)
        for r in mine:
            column = r.labels.method if r.labels.budget == FULL_CACHE.spec else f"{r.labels.method} @{r.labels.budget}"
            cells[(r.labels.task, column)].append(float(r.score))
        tasks = sorted({t for t, _ in cells})
        columns = sorted({c for _, c in cells}, key=lambda c: (not c.startswith(FULL_CACHE.spec), c))
        grids.append((model, tasks, columns, cells))
    width = max(len(g[2]) for g in grids)
    height = sum(len(g[1]) for g in grids)
    fig = new_figure(min(22.0, 2.5 + 0.9 * width), 1.5 + 0.45 * height + 1.0 * len(grids))
    axes = fig.subplots(len(grids), 1, squeeze=False)
    for ax, (model, tasks, columns, cells) in zip(axes[:, 0], grids):
        matrix = [[fmean(cells[(t, c)]) if (t, c) in cells else math.nan for c in columns] for t in tasks]
        image = ax.imshow(matrix, cmap="viridis", aspect="auto", vmin=0, vmax=100)
        ax.set_xticks(range(len(columns)), labels=columns, rotation=40, ha="right", fontsize="small")
        ax.set_yticks(range(len(tasks)), labels=tasks, fontsize="small")
        for i, row in enumerate(matrix):
            for j, value in enumerate(row):
                if not math.isnan(value):
                    ax.text(j, i, f"{value:.1f}", ha="center", va="center", fontsize="x-small",
                            color="white" if value < 60 else "black")
        ax.set_title(model if len(grids) > 1 else "score by task and method")
        fig.colorbar(image, ax=ax, label="score", shrink=0.8)
    return fig


def needle_figures(records: Sequence[Record]) -> list[tuple[str, Figure]]:
    """Depth x context length retrieval heatmap per model, task, method and budget (niah_grid records)."""
    figures = []
    for grid in needle_grids(records):
        matrix = [[grid.score(d, n) if grid.score(d, n) is not None else math.nan for n in grid.lengths]
                  for d in grid.depths]
        fig = new_figure(1.8 + 0.7 * len(grid.lengths), 1.4 + 0.35 * len(grid.depths))
        ax = fig.subplots()
        image = ax.imshow(matrix, cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
        ax.set_xticks(range(len(grid.lengths)), labels=[str(n) for n in grid.lengths], rotation=40, ha="right")
        ax.set_yticks(range(len(grid.depths)), labels=[f"{d:g}%" for d in grid.depths])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("needle depth")
        ax.set_title(grid.title)
        fig.colorbar(image, ax=ax, label="retrieval score", shrink=0.8)
        figures.append((grid.title, fig))
    return figures


def variance_figure(curves: Sequence[tuple[str, VariationCurve]]) -> Figure:
    """Coefficient of variation of the mean against the number of seeds, with the projection."""
    fig = new_figure(7.5, 4.5)
    ax = fig.subplots()
    threshold = None
    for label, curve in curves:
        threshold = curve.threshold
        if not curve.points:
            continue
        ks = [k for k, _, _ in curve.points]
        line = ax.plot(ks, [100 * m for _, _, m in curve.points], marker="o", label=label)[0]
        if math.isfinite(curve.cv):
            last = max(curve.n, curve.needed or curve.n)
            projected = list(range(curve.n, last + 1))
            if len(projected) > 1:
                ax.plot(projected, [100 * curve.cv / math.sqrt(k) for k in projected], linestyle="--",
                        color=line.get_color(), alpha=0.7)
    if threshold is not None:
        ax.axhline(100 * threshold, color="0.3", linestyle=":", label=f"threshold {100 * threshold:g}%")
    ax.set_xlabel("number of seeds")
    ax.set_ylabel("CV of the mean score (%)")
    ax.set_title("variation against seeds (dashed: projected from all seeds)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig
