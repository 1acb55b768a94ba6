"""RESULTS.md and the terminal table: Method x Task per model and budget, as papers print them.

One table per (model, budget): the ``full`` row first as the reference, then each method, an Avg
column over tasks, the fidelity columns (mean KL, greedy agreement) and the mean KV memory kept;
the best compressed score of each column in bold. Several seeds of one cell are averaged.
"""

from __future__ import annotations

from collections import defaultdict
from statistics import fmean

from tabulate import tabulate

from pytest_kvbench.wiring.grid import FULL_METHOD


def _task_label(record: dict) -> str:
    task = record["task"]
    ctx = task.get("context_length")
    return f"{task['name']}@{ctx}" if ctx else task["name"]


def _method_label(record: dict) -> str:
    return record.get("item_id", "").split("-")[0] or record["method"]["name"]


def _fmt(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def collect(records: list[dict]) -> dict:
    """{model: {budget: {method: {task: [records]}}}} of scored records; full goes under every budget."""
    scored = [r for r in records if r.get("score") is not None and r.get("status") in ("passed", "failed", None)]
    budgets_by_model: dict[str, list[str]] = defaultdict(list)
    for r in scored:
        spec = r["budget"]["spec"]
        if spec != FULL_METHOD and spec not in budgets_by_model[r["model"]["name"]]:
            budgets_by_model[r["model"]["name"]].append(spec)
    out: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(lambda: defaultdict(list))))
    for r in scored:
        model = r["model"]["name"]
        spec = r["budget"]["spec"]
        targets = budgets_by_model[model] or [FULL_METHOD] if spec == FULL_METHOD else [spec]
        for budget in targets:
            out[model][budget][_method_label(r)][_task_label(r)].append(r)
    return out


def budget_tables(records: list[dict], fmt: str = "github", bold: bool = True) -> list[tuple[str, str]]:
    """[(heading, table text)] for every model and budget."""
    tables = []
    for model, by_budget in collect(records).items():
        for budget, by_method in by_budget.items():
            tasks = sorted({t for cells in by_method.values() for t in cells})
            methods = sorted(by_method, key=lambda m: (m != FULL_METHOD, m))
            values = {m: {t: fmean(r["score"] for r in by_method[m][t]) for t in by_method[m]} for m in methods}
            best = {}
            for column in tasks + ["Avg"]:
                candidates = [
                    (values[m].get(column) if column != "Avg" else _avg(values[m], tasks))
                    for m in methods if m != FULL_METHOD
                ]
                candidates = [c for c in candidates if c is not None]
                # no bold where every compressed method ties: nothing stands out
                best[column] = max(candidates) if candidates and max(candidates) > min(candidates) else None
            rows = []
            for m in methods:
                cells = [m]
                for column in tasks + ["Avg"]:
                    v = values[m].get(column) if column != "Avg" else _avg(values[m], tasks)
                    text = _fmt(v)
                    if bold and m != FULL_METHOD and v is not None and v == best[column] and len(methods) > 2:
                        text = f"**{text}**"
                    cells.append(text)
                flat = [r for cells_ in by_method[m].values() for r in cells_]
                cells.append(_fmt(_nanmean(r.get("fidelity", {}).get("kl") for r in flat), 4))
                cells.append(_fmt(_nanmean(r.get("fidelity", {}).get("agreement") for r in flat), 3))
                kv = _nanmean((r.get("memory") or {}).get("kv_bytes_after") for r in flat)
                cells.append(_fmt(kv / 2**20 if kv else None, 2))
                rows.append(cells)
            headers = ["Method"] + tasks + ["Avg", "KL", "Agree", "KV MiB"]
            budget_text = "full cache" if budget == FULL_METHOD else f"budget {budget}"
            tables.append((f"{model} — {budget_text}", tabulate(rows, headers=headers, tablefmt=fmt, disable_numparse=True)))
    return tables


def _avg(values: dict, tasks: list[str]) -> float | None:
    present = [values[t] for t in tasks if t in values]
    return fmean(present) if present and len(present) == len(tasks) else None


def _nanmean(values) -> float | None:
    values = [v for v in values if v is not None]
    return fmean(values) if values else None


def needle_heatmaps(records: list[dict], fmt: str = "github") -> list[tuple[str, str]]:
    """Depth x context length tables of the needle-grid tasks (niah_grid*), one per model/method/budget."""
    cells: dict = defaultdict(lambda: defaultdict(list))
    for r in records:
        if not r["task"]["name"].startswith("niah_grid"):
            continue
        for sample in r.get("samples") or []:
            fields = sample.get("fields") or {}
            if "depth" in fields:
                length = fields.get("context_length") or r["task"].get("context_length")
                cells[(r["model"]["name"], r["task"]["name"], _method_label(r), r["budget"]["spec"])][
                    (float(fields["depth"]), length)].append(100.0 * sample["score"])
    tables = []
    for (model, task, method, budget), grid in sorted(cells.items()):
        depths = sorted({d for d, _ in grid})
        lengths = sorted({n for _, n in grid})
        rows = [[f"{d:g}%"] + [_fmt(fmean(grid[(d, n)]) if grid.get((d, n)) else None, 0) for n in lengths]
                for d in depths]
        heading = f"{model} — {task} — {method}" + ("" if budget == FULL_METHOD else f" @ {budget}")
        tables.append((heading, tabulate(rows, headers=["depth \\ tokens"] + [str(n) for n in lengths],
                                         tablefmt=fmt, disable_numparse=True)))
    return tables


def results_markdown(run: dict, records: list[dict]) -> str:
    """The whole RESULTS.md of a run."""
    lines = [
        "# Results",
        "",
        f"Run `{run['run_id']}` — {run.get('start', '')} — commit `{(run.get('environment') or {}).get('git_commit') or 'n/a'}`"
        + (" (incomplete)" if not run.get("complete", True) else ""),
        "",
        "Scores are the task's official metric x 100 (mean over samples; mean over seeds when several ran).",
        "KL: mean KL(full || method) over answer tokens (nats); Agree: greedy-token agreement with the full cache;",
        "KV MiB: mean KV-cache size kept after compression. Best compressed score per column in bold.",
        "",
    ]
    for heading, table in budget_tables(records):
        lines += [f"## {heading}", "", table, ""]
    heatmaps = needle_heatmaps(records)
    if heatmaps:
        lines += ["## Needle in a haystack: score by depth and context length", ""]
        for heading, table in heatmaps:
            lines += [f"### {heading}", "", table, ""]
    zeros = sorted(r["item_id"] for r in records if r.get("score") == 0)
    if zeros:
        lines += ["## Items scoring exactly 0", "", ", ".join(f"`{z}`" for z in zeros), ""]
    unfinished = run.get("unfinished") or []
    if unfinished:
        lines += ["## Items not finished", "",
                  f"The run is incomplete. Finish it with `{run.get('resume_command')}`.", ""]
        lines += [f"- `{u['item_id']}`: {u.get('reason')}" for u in unfinished]
        lines.append("")
    problems = [r for r in records if r.get("status") in ("failed", "error") and not r.get("crashed")]
    if problems:
        lines += ["## Failed items", ""]
        lines += [f"- `{r['item_id']}`: {r.get('message') or r.get('status')}" for r in problems]
        lines.append("")
    return "\n".join(lines)
