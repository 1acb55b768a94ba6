"""A single self-contained HTML page about one or more runs.

Self-contained means one file that can be mailed, attached to a CI job or opened offline years
later: plots are inline SVG (text stays text, searchable and sharp), styles are inline, nothing
is fetched. matplotlib is used through ``Figure`` objects only (no pyplot global state), so the
module is safe to call from a pytest session or a thread.

The plots come from report/budget_figures.py (score against budget with 95% bands, KL and agreement against
budget) and figures.py (score against KV memory, a task x method heatmap, the needle-in-a-haystack
heatmaps). A task whose full cache scores 0 is named in one line and left out of the plots: every
method scores 0 there too. The page fits a laptop screen: a table wider than the page scrolls inside
its own box, long values wrap, and a script counts what still runs off the page (the browser test reads it).
"""

from __future__ import annotations

import html
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import datetime
from importlib import resources
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING

from pytest_kvbench.atomic_files import atomic_write_text
from pytest_kvbench.results.report.budget_figures import fidelity_figure, score_budget_figure
from pytest_kvbench.results.report.figures import (ReportError, figure_svg, heatmap_figure, memory_figure, needle_figures,
                                            tasks_without_signal, with_signal)
from pytest_kvbench.results.record import Record
from pytest_kvbench.results.run.directories import Run
from pytest_kvbench.results.views.table_model import ScoreTable, cell_text, score_tables

if TYPE_CHECKING:
    from matplotlib.figure import Figure



# -- the page ---------------------------------------------------------------------------------


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _table_html(headers: Sequence[str], rows: Iterable[Sequence[str]], css: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<div class="table-box"><table class="{css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


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
                          if summary.by_turn)


def _turn_table_html(summary, methods: list[str]) -> str:
    """A score-by-turn table (SCBench's tasks, the multi_turn protocol) under its score table."""
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


def _tag_runs(runs: Sequence[Run]) -> list[Record]:
    """All records; when the same item appears in several runs, method labels name the run."""
    owners: dict[str, set[str]] = defaultdict(set)
    for run in runs:
        for r in run.records:
            owners[r.key].add(run.run_id)
    clash = any(len(ids) > 1 for ids in owners.values())
    records = []
    for run in runs:
        for r in run.records:
            if clash:
                label = r.labels
                short = run.run_id.split("_")[1] if run.run_id.count("_") >= 2 else run.run_id
                method = f"{label.method} [{short}]"
                r = replace(r, key=label._replace(method=method).text, item_id=method)
            records.append(r)
    return records


def build_report(runs: Sequence[Run], title: str | None = None) -> str:
    """The whole HTML page for one or more runs."""
    records = _tag_runs(runs)
    if not any(r.is_scored for r in records):
        raise ReportError("nothing to report: no item of " + ", ".join(r.run_id for r in runs) + " has a score")
    title = title or "kvbench report: " + ", ".join(r.run_id for r in runs)
    sections: list[tuple[str, str, str]] = []  # (anchor, heading, html)

    overview_rows = [[_e(r.run_id), _e(r.started.strftime("%Y-%m-%d %H:%M") if r.started else "-"),
                      _e(r.commit or "-") + (" (dirty)" if r.dirty else ""), _e(r.state.label()),
                      _e(len(r.records)), _e(r.command or "-")] for r in runs]
    sections.append(("runs", "Runs", _table_html(["run", "date", "commit", "state", "items", "command"],
                                                  overview_rows, "kv")))
    sections.append(("scores", "Scores", "".join(_score_table_html(t) for t in score_tables(records))))

    plotted = with_signal(records)
    silent = tasks_without_signal(records)
    if silent:
        sections.append(("no-signal", "Tasks without signal", (
            f'<p class="note" id="no-signal">Full cache scores 0 on {_e(", ".join(silent))}: every method scores 0 '
            "there too, so they are in the tables above but not plotted.</p>")))
    plots = []
    for kind, caption in (("tokens", "Score against KV budget (tokens) per task and method; band: 95% CI"),
                          ("ratio", "Score against the fraction of the KV cache kept per task and method; "
                                    "band: 95% CI")):
        fig = score_budget_figure(plotted, kind)
        if fig is not None:
            plots.append(_figure_html(fig, caption, f"budget-{kind}"))
    if plots:
        sections.append(("budget", "Score against budget", "".join(plots)))
    fig = fidelity_figure(plotted)
    if fig is not None:
        sections.append(("fidelity", "Fidelity to the full cache", _figure_html(
            fig, "KL divergence to the full cache and greedy-token agreement against budget (mean over tasks)",
            "fidelity")))
    fig = memory_figure(plotted)
    if fig is not None:
        sections.append(("memory", "Score against KV memory",
                         _figure_html(fig, "Average score over tasks against the KV cache kept", "memory")))
    fig = heatmap_figure(plotted)
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
    template = Template(resources.files("pytest_kvbench.results.report").joinpath("template.html").read_text(encoding="utf-8"))
    return template.substitute(title=_e(title), nav=nav, body=body,
                               generated=_e(datetime.now().astimezone().isoformat(timespec="seconds")))


def write_report(runs: Sequence[Run], output: str | os.PathLike, title: str | None = None) -> Path:
    """Build the page and write it atomically (an existing report is replaced only when complete)."""
    page = build_report(runs, title)
    target = Path(output)
    try:
        atomic_write_text(target, page)
    except OSError as exc:
        raise ReportError(f"cannot write report {target}: {exc.strerror or exc}") from None
    return target
