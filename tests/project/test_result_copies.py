"""The result tables that README.md and docs/ copy equal their source files, and documented defaults equal the code.

Why: README's real-model tables and docs/default-selection.md's are hand copies of
results/real/RESULTS.md (its averages over tasks) and default_model/task_scores.toml (README's llama.cpp table of results/engine/RESULTS.md);
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


AVERAGES = re.compile(r"^### (.* — Avg over \d+ tasks(?: at [\d,]+ tokens)?)$", re.MULTILINE)


def real_results(path: Path = REAL_RESULTS) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """A RESULTS.md's averages over tasks (results/real/RESULTS.md's by default): heading -> budget -> method ->
    {score, half_width}."""
    text = path.read_text()
    found = {}
    for heading in AVERAGES.findall(text):
        header, *rows = table_after(text, f"### {heading}")
        found[heading] = {budget: {} for budget in header[1:]}
        for row in rows:
            for budget, cell in zip(header[1:], row[1:]):
                if cell != "-":
                    score, half_width = CELL.match(cell).groups()
                    found[heading][budget][base_label(row[0])] = {"score": float(score),
                                                                   "half_width": float(half_width or 0)}
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
            if cell == "-" or method not in source[budget]:
                if (cell == "-") != (method not in source[budget]):
                    wrong.append(f"{where}: {method} at {budget}: {cell!r}, source {source[budget].get(method)}")
                continue
            score, half_width = CELL.match(cell).groups()
            want = source[budget][method]
            if not (equal_as_printed(score, want["score"])
                    and (half_width is None or equal_as_printed(half_width, want["half_width"]))):
                wrong.append(f"{where}: {method} at {budget}: {cell!r}, source {want['score']} ± {want['half_width']}")
    return wrong


def test_readme_real_model_tables_equal_results_real():
    """README quotes one compact table per real model, each under its RESULTS.md heading: every method of the run
    once, each cell as the source prints it (rounded to the decimals README shows)."""
    source = real_results()
    readme = (ROOT / "README.md").read_text()
    assert len(source) >= 2  # both real models, the global-attention one and the hybrid
    section = readme[readme.index("## Real-model results"):]
    for heading, budgets in source.items():
        header, *rows = table_after(section, heading)
        assert header[1:] == list(budgets), heading
        methods = {method for cells in budgets.values() for method in cells}
        assert {base_label(row[0]) for row in rows} == methods and len(rows) == len(methods), heading
        assert check_score_cells(rows, list(budgets), source[heading], "README.md") == []


@pytest.mark.parametrize("source, intro", [
    ("RESULTS-2025.md", "The 2025-26 methods of issue 49 on the same items"),
    ("RESULTS-2025-gemma.md", "On gemma3-270m the same methods ran on the two tasks"),
])
def test_readme_tables_of_the_2025_methods_equal_their_runs(source, intro):
    """README's tables of issue 49's methods on each real model copy that run's averages (results/real/RESULTS-2025*.md):
    every method of the run but its full cache (quoted in the sentence above the table), each cell as printed."""
    (heading, budgets), = real_results(ROOT / "results" / "real" / source).items()
    readme = (ROOT / "README.md").read_text()
    header, *rows = table_after(readme, intro)
    assert header[1:] == list(budgets)
    methods = {method for cells in budgets.values() for method in cells} - {"full"}
    assert {base_label(row[0]) for row in rows} == methods and len(rows) == len(methods)
    assert check_score_cells(rows, list(budgets), budgets, "README.md") == []
    full = budgets[header[1]]["full"]
    intro_text = readme[readme.index(intro):readme.index("| method |", readme.index(intro))]
    assert f"{full['score']:.1f} ± {full['half_width']:.1f}" in intro_text


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
    header, *rows = table_after(text, "| row | budget table |")
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
