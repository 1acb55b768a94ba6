"""The result tables that README.md and docs/ copy equal their source files, and documented defaults equal the code.

Why: README's real-model table, docs/real-model.md's and docs/default-selection.md's are hand copies of
results/real/RESULTS.md and default_model/task_scores.toml (README's llama.cpp table of results/engine/RESULTS.md);
a regenerated source left them stale (issue 37 item 6), and README documented "all built-ins" as the default
methods when the default was 8 of 17. Each copy is parsed and compared cell by cell, at the precision the copy
prints.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pytest_kvbench.wiring.default_selection import full_cache_scores
from pytest_kvbench.wiring.grid.options import DEFAULT_METHODS

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

ROOT = Path(__file__).resolve().parents[2]
REAL_RESULTS = ROOT / "results" / "real" / "RESULTS.md"
CELL = re.compile(r"^\*{0,2}(-?[\d.]+)(?: ± ([\d.]+))?\*{0,2}$")


def table_after(text: str, heading: str) -> list[list[str]]:
    """The rows (cells stripped, header first) of the first markdown table at or after the line containing
    ``heading``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if heading in line)
    rows, begun = [], False
    for line in lines[start:]:
        if line.startswith("|"):
            begun = True
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not all(set(cell) <= set("-: ") for cell in cells):
                rows.append(cells)
        elif begun:
            break
    return rows


def base_label(label: str) -> str:
    """A method row's name without its note: 'kivi (2-bit, ...)' and 'snapkv+kivi(bits=4)' -> 'kivi', 'snapkv+kivi'."""
    return label.split("(", 1)[0].strip()


def real_results() -> dict[str, dict[str, dict[str, float]]]:
    """results/real/RESULTS.md: budget -> method -> {score, half_width, kl, agree}."""
    text = REAL_RESULTS.read_text()
    found = {}
    for budget in re.findall(r"^## .* — budget (\S+)$", text, re.MULTILINE):
        header, *rows = table_after(text, f"— budget {budget}")
        column = {name: index for index, name in enumerate(header)}
        score_column = next(index for name, index in column.items() if "@" in name)
        found[budget] = {}
        for row in rows:
            score, half_width = CELL.match(row[score_column]).groups()
            found[budget][base_label(row[0])] = {"score": float(score), "half_width": float(half_width or 0),
                                                 "kl": float(row[column["KL"]]), "agree": float(row[column["Agree"]])}
    return found


def equal_as_printed(copy: str, value: float) -> bool:
    """The copy's number is the value rounded to the decimals the copy shows."""
    decimals = len(copy.split(".", 1)[1]) if "." in copy else 0
    return float(copy) == round(value, decimals)


def check_score_cells(rows: list[list[str]], budgets: list[str], source: dict, where: str) -> list[str]:
    wrong = []
    for row in rows:
        method = base_label(row[0])
        for budget, cell in zip(budgets, row[1:]):
            score, half_width = CELL.match(cell).groups()
            want = source[budget][method]
            if not (equal_as_printed(score, want["score"])
                    and (half_width is None or equal_as_printed(half_width, want["half_width"]))):
                wrong.append(f"{where}: {method} at {budget}: {cell!r}, source {want['score']} ± {want['half_width']}")
    return wrong


def test_readme_real_model_table_equals_results_real():
    source = real_results()
    header, *rows = table_after((ROOT / "README.md").read_text(), "## Real-model results")
    budgets = header[1:]
    assert budgets == list(source) and len(rows) == len(source[budgets[0]])  # every method of the run, once
    assert {base_label(row[0]) for row in rows} == set(source[budgets[0]])
    assert check_score_cells(rows, budgets, source, "README.md") == []


def test_real_model_doc_table_equals_results_real():
    source = real_results()
    text = (ROOT / "docs" / "real-model.md").read_text()
    header, *rows = table_after(text, "| method | m0.0625 | m0.125 | m0.25 | KL m0.125 | agree m0.125 |")
    budgets = header[1:4]
    assert {base_label(row[0]) for row in rows} == set(source[budgets[0]])
    assert check_score_cells([row[:4] for row in rows], budgets, source, "docs/real-model.md") == []
    for row in rows:
        want = source["m0.125"][base_label(row[0])]
        assert equal_as_printed(row[4], want["kl"]) and equal_as_printed(row[5], want["agree"]), (row, want)


def test_default_selection_table_equals_the_task_scores_file():
    rows = table_after((ROOT / "docs" / "default-selection.md").read_text(), "| task | full-cache score |")[1:]
    scores = full_cache_scores()
    copied = {row[0].split(" ", 1)[0].split(":", 1)[0]: (float(row[1]), row[2]) for row in rows}
    assert set(copied) == set(scores)
    for task, (score, selection) in copied.items():
        assert score == pytest.approx(scores[task], abs=0.005), task
        assert selection == ("yes" if scores[task] > 0 else "left out"), task


@pytest.mark.parametrize("page", ["README.md", "docs/options.md"])
def test_the_documented_default_methods_are_the_default(page):
    row = next(line for line in (ROOT / page).read_text().splitlines() if line.startswith("| `--kvbench-methods`"))
    default = row.strip().strip("|").split("|")[-1]
    assert re.findall(r"`([a-z0-9_]+)`", default) == DEFAULT_METHODS
    assert "`kvbench methods` lists every built-in" in default  # no count to keep equal by hand


ENGINE_RESULTS = ROOT / "results" / "engine" / "RESULTS.md"


def engine_results() -> dict[str, dict[str, dict[str, str]]]:
    """results/engine/RESULTS.md: budget -> row -> {column: cell as printed}."""
    text = ENGINE_RESULTS.read_text()
    found = {}
    for budget in re.findall(r"^## .* — budget (\S+)$", text, re.MULTILINE):
        header, *rows = table_after(text, f"— budget {budget}")
        found[budget] = {row[0]: dict(zip(header, row)) for row in rows}
    return found


def test_readme_engine_table_equals_results_engine():
    """README's llama.cpp table: each score (± half-width), Agree and KV MiB cell is the source's cell of that row
    in the budget table(s) its `budget table` column names; `not run` where the source has no score."""
    source = engine_results()
    text = (ROOT / "README.md").read_text()
    header, *rows = table_after(text, "| row | budget table | niah_single_1 |")
    tasks = [f"{name}@2048" for name in header[2:header.index("Agree")]]
    assert {base_label(row[0]) for row in rows} == {name for table in source.values() for name in table}
    for row in rows:
        name = base_label(row[0])
        budgets = [b for b in source if name in source[b]] if row[1] == "both" else row[1].split(" / ")
        for column, cell in zip([*tasks, "Agree", "KV MiB"], row[2:]):
            parts = cell.split(" / ")
            for budget, part in zip(budgets, parts * len(budgets) if len(parts) == 1 else parts):
                want = source[budget][name][column]
                if part == "not run":
                    assert want == "-", (name, budget, column, want)
                    continue
                score, half_width = CELL.match(part).groups()
                want_score, want_half = CELL.match(want).groups()
                assert equal_as_printed(score, float(want_score)), (name, budget, column, part, want)
                assert half_width is None or equal_as_printed(half_width, float(want_half or 0)), (name, budget, part)
