"""The report's plots against the KV budget: score with its confidence band, and fidelity to the full cache.

Score against budget, one panel per task and one line per method, with a shaded 95% band: the Student-t
interval over seeds when several seeds ran (stats.seed_summary), else the bootstrap interval of
the mean over the item's samples (stats.bootstrap_mean), which is the uncertainty of a single
run. The full cache is a dashed reference line. Fidelity against budget: KL(full || method) over the answer
tokens and greedy-token agreement with the full cache, one line per method (mean over tasks): they separate
methods even where scores tie. Budgets are token counts (log2 axis) or, for ratio budgets, the fraction kept.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from statistics import fmean
from typing import TYPE_CHECKING

from pytest_kvbench.results.report.figures import new_figure, palette, series_label
from pytest_kvbench.results.record import Record
from pytest_kvbench.stats import bootstrap_mean, seed_summary

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

BAND_RESAMPLES = 2_000  # per plotted point: enough for a drawn band, fast for a grid of hundreds of items


def budget_x(record: Record) -> tuple[str, float] | None:
    """(axis kind, x value) of a record's budget: tokens kept, or fraction of the prompt kept; None for full."""
    value = record.budget.value
    if not isinstance(value, (int, float)):
        return None
    if record.budget.kind == "ratio":
        return "ratio", 1.0 - float(value)
    return "tokens", float(value)


def score_interval(records: Sequence[Record]) -> tuple[float, float, float]:
    """(mean, low, high) of the score of one (task, method, budget): over seeds, else over samples (x 100).
    low and high are NaN when there is no spread to measure (one seed of one sample)."""
    scores = [float(r.score) for r in records]
    if len(scores) > 1:
        return seed_summary(scores)
    per_sample = records[0].sample_scores
    if len(per_sample) < 2:
        return scores[0], math.nan, math.nan
    _, low, high = bootstrap_mean(per_sample, n_resamples=BAND_RESAMPLES)
    return scores[0], low, high


def _budget_axis(ax: Axes, kind: str, budgets: list[float]) -> None:
    if kind == "tokens":
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, labels=[f"{b:g}" for b in budgets])
        ax.minorticks_off()
        ax.set_xlabel("KV budget (tokens per layer and head)")
    else:
        ax.set_xlabel("fraction of the prompt's KV cache kept")
    ax.grid(True, alpha=0.3)


def _shared_legend(fig: Figure, axes) -> None:
    legend: dict[str, object] = {}
    for ax in axes:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(text, handle)
    fig.legend(list(legend.values()), list(legend), loc="outside lower center", ncols=min(4, max(1, len(legend))),
               fontsize="small")


def score_budget_figure(records: Sequence[Record], kind: str) -> Figure | None:
    """Score against budget, one panel per task, one line per method with its 95% band; full cache dashed."""
    scored = [r for r in records if r.is_scored]
    several_models = len({r.model.name for r in scored}) > 1
    points: dict[str, dict[str, dict[float, list[Record]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    references: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in scored:
        x = budget_x(r)
        if x is None:
            references[r.labels.task][series_label(r, several_models)].append(float(r.score))
        elif x[0] == kind:
            points[r.labels.task][series_label(r, several_models)][x[1]].append(r)
    tasks = sorted(points)
    if not tasks:
        return None
    colours = palette(scored)
    columns = min(3, len(tasks))
    rows = math.ceil(len(tasks) / columns)
    fig = new_figure(4.2 * columns, 3.2 * rows)
    axes = fig.subplots(rows, columns, squeeze=False)
    for index, task in enumerate(tasks):
        ax = axes[index // columns][index % columns]
        for series, by_x in sorted(points[task].items()):
            xs = sorted(by_x)
            stats = [score_interval(by_x[x]) for x in xs]
            ax.plot(xs, [m for m, _, _ in stats], marker="o", label=series, color=colours[series])
            if any(math.isfinite(low) for _, low, _ in stats):
                ax.fill_between(xs, [low if math.isfinite(low) else m for m, low, _ in stats],
                                [high if math.isfinite(high) else m for m, _, high in stats],
                                color=colours[series], alpha=0.15, linewidth=0)
        for series, values in sorted(references[task].items()):
            ax.axhline(fmean(values), linestyle="--", color="0.4", linewidth=1, label=f"{series} (no compression)")
        _budget_axis(ax, kind, sorted({x for by_x in points[task].values() for x in by_x}))
        ax.set_ylabel("score (band: 95% CI)")
        ax.set_title(task)
    for index in range(len(tasks), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    _shared_legend(fig, axes.flat)
    return fig


def fidelity_figure(records: Sequence[Record]) -> Figure | None:
    """KL to the full cache and greedy-token agreement against budget, one line per method (mean over tasks)."""
    scored = [r for r in records if r.is_scored and budget_x(r) is not None]
    kinds = [budget_x(r)[0] for r in scored]
    kind = "tokens" if "tokens" in kinds else "ratio"
    several_models = len({r.model.name for r in scored}) > 1
    values: dict[str, dict[str, dict[float, list[float]]]] = {"kl": defaultdict(lambda: defaultdict(list)),
                                                             "agreement": defaultdict(lambda: defaultdict(list))}
    for r in scored:
        x = budget_x(r)
        for metric, by_series in values.items():
            value = getattr(r.fidelity, metric)
            if x[0] == kind and isinstance(value, (int, float)) and math.isfinite(value):
                by_series[series_label(r, several_models)][x[1]].append(float(value))
    if not values["kl"] and not values["agreement"]:
        return None
    colours = palette([r for r in records if r.is_scored])  # the page's colours: full included
    fig = new_figure(9.0, 3.6)
    axes = fig.subplots(1, 2, squeeze=False)[0]
    budgets = sorted({x for by_series in values.values() for by_x in by_series.values() for x in by_x})
    for ax, (metric, title) in zip(axes, (("kl", "KL(full || method), nats (lower is closer)"),
                                          ("agreement", "greedy-token agreement with full (higher is closer)"))):
        for series, by_x in sorted(values[metric].items()):
            xs = sorted(by_x)
            ax.plot(xs, [fmean(by_x[x]) for x in xs], marker="o", label=series, color=colours[series])
        _budget_axis(ax, kind, budgets)
        ax.set_title(title, fontsize="medium")
    if values["kl"]:  # KL spans orders of magnitude and reaches 0 (a method that keeps what matters)
        axes[0].set_yscale("symlog", linthresh=0.01)
        axes[0].set_ylim(bottom=0)
    _shared_legend(fig, axes)
    return fig
