"""A single self-contained HTML page about one or more runs, and the plots it is made of.

Self-contained means one file that can be mailed, attached to a CI job or opened offline years
later: plots are inline SVG (text stays text, searchable and sharp), styles are inline, nothing
is fetched. matplotlib is used through ``Figure`` objects only (no pyplot global state), so the
module is safe to call from a pytest session or a thread.

Plots: score against budget per task and method, average score against KV memory, a task x
method heatmap, the needle-in-a-haystack depth x context length heatmap when ``niah_grid``
records are present, and (for ``kvbench variance``) coefficient of variation against seeds.
"""

from __future__ import annotations

import html
import io
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import datetime
from importlib import resources
from pathlib import Path
from statistics import fmean
from string import Template
from typing import TYPE_CHECKING

from pytest_kvbench.comparison.stats import VariationCurve, seed_summary
from pytest_kvbench.results.needle_grid import needle_grids
from pytest_kvbench.results.record import FULL, is_scored, labels
from pytest_kvbench.results.runs import Run
from pytest_kvbench.results.table_model import ScoreTable, cell_text, score_tables

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MiB = 2**20


class ReportError(ValueError):
    """A report that cannot be produced (nothing scored) or written."""


# -- figures ----------------------------------------------------------------------------------


def _new_figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def figure_svg(fig: Figure, salt: str) -> str:
    """The figure as an inline ``<svg>`` element; ``salt`` keeps ids unique across figures of a page."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def save_figure(fig: Figure, path: str | os.PathLike) -> None:
    """Write a figure to a file whose extension picks the format (png, svg, pdf)."""
    target = Path(path)
    suffix = target.suffix.lower().lstrip(".") or "png"
    if suffix not in ("png", "svg", "pdf"):
        raise ReportError(f"cannot write plot {target}: use a .png, .svg or .pdf file name")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        fig.savefig(tmp, format=suffix, metadata={"Date": None} if suffix == "svg" else None)
        os.replace(tmp, target)
    except OSError as exc:
        raise ReportError(f"cannot write plot {target}: {exc.strerror or exc}") from None


def _series_label(record: dict, several_models: bool) -> str:
    label = labels(record).method
    return f"{record['model']['name']}: {label}" if several_models else label


def _palette(records: Sequence[dict]) -> dict[str, str]:
    """One colour per series for the whole page, so a method looks the same in every plot."""
    from matplotlib import colormaps

    several_models = len({r["model"]["name"] for r in records}) > 1
    labels = sorted({_series_label(r, several_models) for r in records})
    colours = colormaps["tab10"].colors + colormaps["Dark2"].colors
    return {label: colours[i % len(colours)] for i, label in enumerate(labels)}


def _budget_x(record: dict) -> tuple[str, float] | None:
    """(axis kind, x value) of a record's budget: tokens kept, or fraction of the prompt kept."""
    budget = record["budget"]
    value = budget.get("value")
    if not isinstance(value, (int, float)):
        return None
    if budget.get("kind") == "ratio":
        return "ratio", 1.0 - float(value)
    return "tokens", float(value)


def _mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of the 95% interval (0 for a single seed: no error bar)."""
    mean, low, high = seed_summary(values)
    return mean, (high - low) / 2 if math.isfinite(low) else 0.0


def score_budget_figure(records: Sequence[dict], kind: str) -> Figure | None:
    """Score against budget, one panel per task, one line per method; full cache as a dashed line."""
    scored = [r for r in records if is_scored(r)]
    several_models = len({r["model"]["name"] for r in scored}) > 1
    points: dict[str, dict[str, dict[float, list[float]]]] = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    references: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in scored:
        x = _budget_x(r)
        if x is None:
            references[labels(r).task][_series_label(r, several_models)].append(float(r["score"]))
        elif x[0] == kind:
            points[labels(r).task][_series_label(r, several_models)][x[1]].append(float(r["score"]))
    tasks = [t for t in sorted(points)]
    if not tasks:
        return None
    colours = _palette(scored)
    columns = min(3, len(tasks))
    rows = math.ceil(len(tasks) / columns)
    fig = _new_figure(4.2 * columns, 3.2 * rows)
    axes = fig.subplots(rows, columns, squeeze=False)
    for index, task in enumerate(tasks):
        ax = axes[index // columns][index % columns]
        for series, by_x in sorted(points[task].items()):
            xs = sorted(by_x)
            stats = [_mean_ci(by_x[x]) for x in xs]
            ax.errorbar(xs, [m for m, _ in stats], yerr=[h for _, h in stats], marker="o", capsize=3, label=series,
                        color=colours[series])
        for series, values in sorted(references[task].items()):
            ax.axhline(fmean(values), linestyle="--", color="0.4", linewidth=1, label=f"{series} (no compression)")
        if kind == "tokens":
            budgets = sorted({x for by_x in points[task].values() for x in by_x})
            ax.set_xscale("log", base=2)
            ax.set_xticks(budgets, labels=[f"{b:g}" for b in budgets])
            ax.minorticks_off()
            ax.set_xlabel("KV budget (tokens per layer and head)")
        else:
            ax.set_xlabel("fraction of the prompt's KV cache kept")
        ax.set_ylabel("score")
        ax.set_title(task)
        ax.grid(True, alpha=0.3)
    for index in range(len(tasks), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    legend: dict[str, object] = {}
    for ax in axes.flat:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(text, handle)
    fig.legend(list(legend.values()), list(legend), loc="outside lower center", ncols=min(4, max(1, len(legend))),
               fontsize="small")
    return fig


def memory_figure(records: Sequence[dict]) -> Figure | None:
    """Average score over tasks against mean KV memory kept, one line per method across budgets."""
    several_models = len({r["model"]["name"] for r in records if is_scored(r)}) > 1
    by_config: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in records:
        kv = (r.get("memory") or {}).get("kv_bytes_after")
        if is_scored(r) and isinstance(kv, (int, float)) and kv > 0:
            by_config[(_series_label(r, several_models), labels(r).budget)].append(r)
    if not by_config:
        return None
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for (label, _budget), group in by_config.items():
        per_task: dict[str, list[float]] = defaultdict(list)
        for r in group:
            per_task[labels(r).task].append(float(r["score"]))
        average = fmean(fmean(v) for v in per_task.values())
        memory = fmean(float(r["memory"]["kv_bytes_after"]) for r in group) / MiB
        series[label].append((memory, average))
    colours = _palette([r for r in records if is_scored(r)])
    fig = _new_figure(7.0, 4.5)
    ax = fig.subplots()
    for label, xy in sorted(series.items()):
        xy.sort()
        ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", label=label, color=colours[label])
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


def heatmap_figure(records: Sequence[dict]) -> Figure | None:
    """Task x method (at each budget) mean score, annotated, one panel per model."""
    scored = [r for r in records if is_scored(r)]
    if not scored:
        return None
    models = list(dict.fromkeys(r["model"]["name"] for r in scored))
    fig = None
    grids = []
    for model in models:
        mine = [r for r in scored if r["model"]["name"] == model]
        cells: dict[tuple[str, str], list[float]] = defaultdict(list)
        for r in mine:
            column = labels(r).method if labels(r).budget == FULL else f"{labels(r).method} @{labels(r).budget}"
            cells[(labels(r).task, column)].append(float(r["score"]))
        tasks = sorted({t for t, _ in cells})
        columns = sorted({c for _, c in cells}, key=lambda c: (not c.startswith(FULL), c))
        grids.append((model, tasks, columns, cells))
    width = max(len(g[2]) for g in grids)
    height = sum(len(g[1]) for g in grids)
    fig = _new_figure(min(22.0, 2.5 + 0.9 * width), 1.5 + 0.45 * height + 1.0 * len(grids))
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


def needle_figures(records: Sequence[dict]) -> list[tuple[str, Figure]]:
    """Depth x context length retrieval heatmap per model, task, method and budget (niah_grid records)."""
    figures = []
    for grid in needle_grids(records):
        matrix = [[grid.score(d, n) if grid.score(d, n) is not None else math.nan for n in grid.lengths]
                  for d in grid.depths]
        fig = _new_figure(1.8 + 0.7 * len(grid.lengths), 1.4 + 0.35 * len(grid.depths))
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
    fig = _new_figure(7.5, 4.5)
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


# -- the page ---------------------------------------------------------------------------------


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _table_html(headers: Sequence[str], rows: Iterable[Sequence[str]], css: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _score_table_html(table: ScoreTable) -> str:
    rows = []
    for method in table.methods:
        cells = [_e(method)]
        for column in table.columns:
            text = _e(cell_text(table, method, column))
            cells.append(f"<strong>{text}</strong>" if table.is_best(method, column) else text)
        rows.append(cells)
    html = f"<h3>{_e(table.heading)}</h3>" + _table_html(["Method"] + table.columns, rows, "scores")
    return html + "".join(_turn_table_html(summary, table.methods) for summary in table.summaries()
                          if summary.title == "score by turn")


def _turn_table_html(summary, methods: list[str]) -> str:
    """The multi_turn protocol's score by turn under its score table."""
    rows = [[_e(m)] + ["-" if summary.values[m].get(c) is None else f"{summary.values[m][c]:.2f}"
                       for c in summary.columns] for m in methods if m in summary.values]
    return f"<h4>{_e(summary.title)}</h4>" + _table_html(["Method"] + summary.columns, rows, "scores")


def _figure_html(fig: Figure, caption: str, salt: str) -> str:
    svg = figure_svg(fig, salt)
    return f'<figure class="plot" data-plot="{_e(salt)}">{svg}<figcaption>{_e(caption)}</figcaption></figure>'


def _flatten(data: dict, prefix: str = "") -> list[tuple[str, str]]:
    out = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out += _flatten(value, name + ".")
        else:
            out.append((name, "" if value is None else str(value)))
    return out


def _tag_runs(runs: Sequence[Run]) -> list[dict]:
    """All records; when the same item appears in several runs, method labels name the run."""
    owners: dict[str, set[str]] = defaultdict(set)
    for run in runs:
        for r in run.records:
            owners[r["key"]].add(run.run_id)
    clash = any(len(ids) > 1 for ids in owners.values())
    records = []
    for run in runs:
        for r in run.records:
            if clash:
                label = labels(r)
                short = run.run_id.split("_")[1] if run.run_id.count("_") >= 2 else run.run_id
                method = f"{label.method} [{short}]"
                r = r | {"key": "|".join([label.model, method, label.budget, label.task, label.seed]), "item_id": method}
            records.append(r)
    return records


def build_report(runs: Sequence[Run], title: str | None = None) -> str:
    """The whole HTML page for one or more runs."""
    records = _tag_runs(runs)
    if not any(is_scored(r) for r in records):
        raise ReportError("nothing to report: no item of " + ", ".join(r.run_id for r in runs) + " has a score")
    title = title or "kvbench report: " + ", ".join(r.run_id for r in runs)
    sections: list[tuple[str, str, str]] = []  # (anchor, heading, html)

    overview_rows = [[_e(r.run_id), _e(r.started.strftime("%Y-%m-%d %H:%M") if r.started else "-"),
                      _e(r.commit or "-") + (" (dirty)" if r.dirty else ""), _e("yes" if r.complete else "no"),
                      _e(len(r.records)), _e(r.command or "-")] for r in runs]
    sections.append(("runs", "Runs", _table_html(["run", "date", "commit", "complete", "items", "command"],
                                                  overview_rows, "kv")))
    sections.append(("scores", "Scores", "".join(_score_table_html(t) for t in score_tables(records))))

    plots = []
    for kind, caption in (("tokens", "Score against KV budget (tokens) per task and method"),
                          ("ratio", "Score against the fraction of the KV cache kept per task and method")):
        fig = score_budget_figure(records, kind)
        if fig is not None:
            plots.append(_figure_html(fig, caption, f"budget-{kind}"))
    if plots:
        sections.append(("budget", "Score against budget", "".join(plots)))
    fig = memory_figure(records)
    if fig is not None:
        sections.append(("memory", "Score against KV memory",
                         _figure_html(fig, "Average score over tasks against the KV cache kept", "memory")))
    fig = heatmap_figure(records)
    if fig is not None:
        sections.append(("heatmap", "Task x method", _figure_html(fig, "Mean score per task and method", "heatmap")))
    needles = needle_figures(records)
    if needles:
        sections.append(("needle", "Needle in a haystack", "".join(
            _figure_html(f, f"Retrieval by needle depth and context length: {label}", f"needle-{i}")
            for i, (label, f) in enumerate(needles))))
    environment = "".join(
        f"<h3>{_e(run.run_id)}</h3>" + _table_html(["setting", "value"], [[_e(k), _e(v)] for k, v in _flatten(run.environment)], "kv")
        for run in runs)
    sections.append(("environment", "Environment", environment))

    nav = "".join(f'<a href="#{a}">{_e(h)}</a>' for a, h, _ in sections)
    body = "".join(f'<section id="{a}"><h2>{_e(h)}</h2>{content}</section>' for a, h, content in sections)
    template = Template(resources.files("pytest_kvbench.results").joinpath("report_template.html").read_text(encoding="utf-8"))
    return template.substitute(title=_e(title), nav=nav, body=body,
                               generated=_e(datetime.now().astimezone().isoformat(timespec="seconds")))


def write_report(runs: Sequence[Run], output: str | os.PathLike, title: str | None = None) -> Path:
    """Build the page and write it atomically (an existing report is replaced only when complete)."""
    from pytest_kvbench.results.storage import atomic_write_text

    page = build_report(runs, title)
    target = Path(output)
    try:
        atomic_write_text(target, page)
    except OSError as exc:
        raise ReportError(f"cannot write report {target}: {exc.strerror or exc}") from None
    return target
