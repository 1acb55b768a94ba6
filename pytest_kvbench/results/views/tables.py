"""RESULTS.md and the terminal summary: the table model (views/table_model.py) printed with tabulate.

Each (model, budget) table shows the task columns (mean ± 95% half-width) and Avg, then the fidelity columns (mean KL,
greedy agreement), the mean KV memory kept (measured from the stored tensors), the peak memory and,
for a byte budget, the share of it used; the best compressed score of each column is bold
in Markdown. Needle grids (views/needle_grid.py) follow as depth x context length tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from tabulate import tabulate

from pytest_kvbench.results.views.needle_grid import needle_grids
from pytest_kvbench.results.record import Record
from pytest_kvbench.results.views.table_model import ScoreTable, cell_text, score_tables
from pytest_kvbench.results.views.task_averages import task_average_tables

HEADERS_AFTER_TASKS = ["KL", "Agree", "KV MiB", "Dec tok/s", "Peak MiB"]
BUDGET_USE = "KV/budget"  # only in the tables of byte budgets ("m0.25")
WINDOW_KV = "Window MiB"  # only in the tables of models with sliding-window layers
ENGINE_TIMES = ["TTFT ms", "TPOT ms"]  # only in the tables holding a serving engine's rows (llamacpp:q8_0)
OWN_HEADERS = frozenset(["Method", "Avg", *HEADERS_AFTER_TASKS, BUDGET_USE, WINDOW_KV, *ENGINE_TIMES])
# A user's columns (the pytest_kvbench_results_columns hook): header -> a row's records -> the cell's text
Columns = Mapping[str, Callable[[list[Record]], object]]


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _rows(table: ScoreTable, bold: bool, columns: Columns) -> list[list[str]]:
    rows = []
    for method in table.methods:
        cells = [method]
        for column in table.columns:
            text = cell_text(table, method, column, over_samples=True)
            cells.append(f"**{text}**" if bold and table.is_best(method, column) else text)
        cells += [_fmt(table.mean_kl(method), 4), _fmt(table.mean_agreement(method), 3),
                  _fmt(table.mean_kv_mib(method), 2), _fmt(table.decode_tokens_per_s(method), 1),
                  _fmt(table.mean_peak_mib(method), 1)]
        if table.is_byte_budget:
            cells.append(_fmt(table.budget_use(method), 3))
        if table.has_window_layers:
            cells.append(_fmt(table.mean_window_mib(method), 2))
        if table.has_engine_rows:
            cells += [_fmt(table.ttft_ms(method), 0), _fmt(table.tpot_ms(method), 1)]
        cells += ["-" if (text := column(table.records[method])) is None else str(text) for column in columns.values()]
        rows.append(cells)
    return rows


def budget_tables(records: list[Record], fmt: str = "github", bold: bool = True,
                  columns: Columns | None = None) -> list[tuple[str, str]]:
    """[(heading, table text)] for every model and budget, each followed by its suite summaries; ``columns``: a
    user's own, after the table's."""
    columns = columns or {}
    tables = []
    for table in score_tables(records):
        headers = ["Method"] + table.columns + HEADERS_AFTER_TASKS + ([BUDGET_USE] if table.is_byte_budget else []) \
            + ([WINDOW_KV] if table.has_window_layers else []) + (ENGINE_TIMES if table.has_engine_rows else []) + list(columns)
        tables.append((table.heading, tabulate(_rows(table, bold, columns), headers=headers, tablefmt=fmt,
                                               disable_numparse=True)))
        tables += [(f"{table.heading} — {summary.title}", summary_table(summary, table.methods, fmt))
                   for summary in table.summaries()]
    return tables


def summary_table(summary, methods: list[str], fmt: str) -> str:
    """A suite's summary (results/views/suite_summaries.py) as one table, rows in the main table's method order."""
    rows = [[m] + [_fmt(summary.values[m].get(c), 1) for c in summary.columns] for m in methods if m in summary.values]
    return tabulate(rows, headers=["Method"] + summary.columns, tablefmt=fmt, disable_numparse=True)


def needle_heatmaps(records: list[Record], fmt: str = "github") -> list[tuple[str, str]]:
    """Depth x context length tables of the needle-grid tasks, one per model/task/method/budget."""
    tables = []
    for grid in needle_grids(records):
        rows = [[f"{depth:g}%"] + [_fmt(grid.score(depth, length), 0) for length in grid.lengths]
                for depth in grid.depths]
        tables.append((grid.title, tabulate(rows, headers=["depth \\ tokens"] + [str(n) for n in grid.lengths],
                                            tablefmt=fmt, disable_numparse=True)))
    return tables


def gguf_models(records: list[Record]) -> list[str]:
    """One line per GGUF-derived model: the file, its sha256, quantization and architecture."""
    seen: dict[str, dict] = {}
    for r in records:
        if isinstance(r.model.gguf, dict):
            seen.setdefault(r.model_title, r.model.gguf)
    return [f"- {title}: `{g.get('file')}`, sha256 `{g.get('sha256')}`, {g.get('quantization')}, "
            f"architecture {g.get('architecture')} (dequantized to float weights by transformers)"
            for title, g in seen.items()]


AVERAGES_NOTE = [
    "Per model, each method's score averaged over the tasks (every task weighted equally, the Avg column below), ±",
    "the half-width of its 95% interval: a bootstrap resampling each task's samples within that task.",
]
ENGINE_NOTE = [
    "Rows named `llamacpp:TYPE` ran in llama.cpp with that KV-cache type (keys and values; `llamacpp(k=..,v=..)`",
    "sets them apart), on the same prompt tokens, decoded greedily and scored by the same scorer. llama.cpp runs the",
    "GGUF file's own quantized weights, whereas transformers runs their float conversion: compare an engine row with",
    "`llamacpp:f16` (the engine's reference) and a method with `full`. TTFT ms / TPOT ms: the engine's own timings",
    "(prompt processing; per output token), for a method its prefill and 1 / its own decode speed. Agree (engine",
    "rows): greedy tokens equal to the transformers full cache's, position by position. A quantized engine cache",
    "stands in the byte-budget table nearest its byte fraction, which is not that budget (see below).",
]


def engine_rows(records: list[Record]) -> list[str]:
    """One line per engine row: its byte fraction of f16, whether its cache bytes match llama.cpp's own figure, its
    agreement with the engine's f16 cache and the top-n KL (means over the row's records)."""
    seen: dict[str, list[Record]] = {}
    for r in records:
        if r.serving is not None and r.is_scored:
            seen.setdefault(r.labels.row, []).append(r)

    def figure(value, digits):
        return "-" if value is None else f"{value:.{digits}f}"

    def mean(values):
        present = [v for v in values if v is not None]
        return sum(present) / len(present) if present else None

    lines = []
    for row, rows in sorted(seen.items()):
        s = replace(rows[0].serving, agreement_engine=mean(r.serving.agreement_engine for r in rows),
                    top_n_kl=mean(r.serving.top_n_kl for r in rows),
                    kv_bytes_agree=None if any(r.serving.kv_bytes_agree is None for r in rows)
                    else all(r.serving.kv_bytes_agree for r in rows))
        checked = {True: "matches llama.cpp's own size", False: "differs from llama.cpp's own size",
                   None: "llama.cpp printed no size"}[s.kv_bytes_agree]
        lines.append(f"- `{row}`: {s.engine} {s.version or ''} on {s.weights} weights, K {s.cache_type_k} / V "
                     f"{s.cache_type_v}: {figure(s.byte_fraction, 3)} of f16's bytes (blocks included; {checked}); "
                     f"agreement with the engine's f16 cache {figure(s.agreement_engine, 3)}, top-{s.top_n} KL "
                     f"{figure(s.top_n_kl, 4)}")
    return lines


def zero_scores(records: list[Record]) -> list[str]:
    """Item ids of the records that scored exactly 0: worth a look (a broken prompt, a method bug)."""
    return sorted(str(r.item_id) for r in records if r.score == 0)


def _how_to_finish(run: dict) -> str:
    """The command that finishes an incomplete run; a merged run has none of its own: its unfinished sources do."""
    if run.get("resume_command"):
        return f"Finish it with `{run['resume_command']}`."
    unfinished = [s.get("run_id") for s in run.get("merged_from") or [] if not s.get("complete", True)]
    if unfinished:
        return (f"Finish {', '.join(f'`{r}`' for r in unfinished)} with its own command and `--kvbench-resume RUN`, "
                f"then merge again.")
    return "Run its missing items again."


def _made_by(run: dict, environment: dict) -> list[str]:
    """The provenance line, or for a merged run (`kvbench merge`) one per source run: each ran its own command,
    perhaps at another commit, which the merged run's single environment (its first source's) would hide."""
    sources = run.get("merged_from") or []
    if not sources:
        return [provenance(environment)]
    return [f"Merged by `kvbench merge` from {len(sources)} runs:", "",
            *(f"- `{source.get('run_id')}` (commit `{(source.get('environment') or {}).get('git_commit') or 'n/a'}`): "
              f"{provenance(source.get('environment') or {})}" for source in sources)]


def provenance(environment: dict) -> str:
    """What made the run, in one line: the command, Python and the packages' versions, the platform, and
    whether the git tree had uncommitted changes to tracked files."""
    versions = ", ".join(f"{name} {version}" for name, version in (environment.get("versions") or {}).items()
                         if version)
    dirty = " (with uncommitted changes)" if environment.get("git_dirty") else ""
    return (f"Made by `{environment.get('command', 'n/a')}` with Python {environment.get('python', 'n/a')}, "
            f"{versions or 'versions n/a'}; {environment.get('platform', 'n/a')}; tree{dirty or ' clean'}.")


def results_markdown(run: dict, records: list[Record], columns: Columns | None = None) -> str:
    """The whole RESULTS.md of a run (``columns``: a user's own, the pytest_kvbench_results_columns hook's)."""
    environment = run.get("environment") or {}
    lines = [
        "# Results",
        "",
        f"Run `{run['run_id']}` — {run.get('start', '')} — commit `{environment.get('git_commit') or 'n/a'}`"
        + (" (incomplete)" if not run.get("complete", True) else ""),
        "",
        *_made_by(run, environment),
        "",
        "Scores are the task's official metric x 100 (mean over samples; mean over seeds when several ran),",
        "± the half-width of their 95% interval: Student t over seeds when several ran, else a bootstrap over samples.",
        "KL: mean KL(full || method) over answer tokens (nats); Agree: greedy-token agreement with the full cache;",
        "KV MiB: mean KV-cache bytes the stored tensors hold after compression (quantized codes, scales, zero points",
        "and full-precision window included); Dec tok/s: the method's own decode speed (tokens per second of the",
        "samples it decoded alone, at batch 1: docs/batched-decoding.md); Peak MiB: the item's peak memory (CPU",
        "resident, or CUDA allocated);",
        "KV/budget (byte budgets `mF`: F x the full cache's bytes): stored bytes over the budget's allowance;",
        "Window MiB (models with sliding-window layers): the part of KV MiB those layers hold, their window kept, or",
        "compressed too in rows marked `(sliding compress)` (--kvbench-sliding compress; docs/models.md).",
        "Best compressed score per column in bold.",
        "",
    ]
    ggufs = gguf_models(records)
    if ggufs:
        lines += ["## Models from GGUF files", "", *ggufs, ""]
    engines = engine_rows(records)
    if engines:
        lines += ["## Serving engine rows", "", *ENGINE_NOTE, "", *engines, ""]
    averages = task_average_tables(records)
    if averages:
        lines += ["## Averages over tasks", "", *AVERAGES_NOTE, ""]
        for heading, table in averages:
            lines += [f"### {heading}", "", table, ""]
    for heading, table in budget_tables(records, columns=columns):
        lines += [f"## {heading}", "", table, ""]
    heatmaps = needle_heatmaps(records)
    if heatmaps:
        lines += ["## Needle in a haystack: score by depth and context length", ""]
        for heading, table in heatmaps:
            lines += [f"### {heading}", "", table, ""]
    zeros = zero_scores(records)
    if zeros:
        lines += ["## Items scoring exactly 0", "", ", ".join(f"`{z}`" for z in zeros), ""]
    unfinished = run.get("unfinished") or []
    if unfinished:
        lines += ["## Items not finished", "", f"The run is incomplete. {_how_to_finish(run)}", ""]
        lines += [f"- `{u['item_id']}`: {u.get('reason')}" for u in unfinished]
        lines.append("")
    crashed = run.get("crashed") or []
    if crashed:
        lines += ["## Items whose worker crashed, then run again", ""]
        lines += [f"- `{c.get('item_id')}`: {c.get('message')}" for c in crashed]
        lines.append("")
    problems = [r for r in records if r.status in ("failed", "error") and not r.crashed]
    if problems:
        lines += ["## Failed items", ""]
        lines += [f"- `{r.item_id}`: {r.message or r.status}" for r in problems]
        lines.append("")
    return "\n".join(lines)


SHOWN_OTHER_RUNS = 5


def shared_results_markdown(markdown: str, run_id: str, others: list[str], results_dir: str) -> str:
    """The results directory's RESULTS.md: the run's own, saying which run it shows and, when other runs share
    the directory, where they are (their own RESULTS.md, ``kvbench list``)."""
    if not others:
        return markdown
    named = ", ".join(f"`{name}`" for name in others[-SHOWN_OTHER_RUNS:]) + (", ..." if len(others) > SHOWN_OTHER_RUNS else "")
    note = (f"This file shows the last run written here, `{run_id}`, only. {len(others)} other run(s) share this "
            f"results directory ({named}): each has its own `runs/<run id>/RESULTS.md`; "
            f"`kvbench list --results {results_dir}` lists them all.")
    lines = markdown.split("\n")
    at = next((i for i, line in enumerate(lines) if line.startswith("Run `")), 1) + 1
    return "\n".join(lines[:at] + ["", note] + lines[at:])
