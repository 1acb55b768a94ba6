"""The import graph of kvmethods and pytest_kvbench stays a layered tree: no circles, no upward arrows, and
no import inside a function unless it says why it is deliberately lazy.

Circles and upward arrows make a part impossible to read, test or move without the parts above it, and an
import moved into a function to dodge a circle hides the circle from every reader. The graph is read from
the source with `ast` (every import statement, those inside functions and under `if TYPE_CHECKING:` included:
a type-only import is an arrow a reader follows too, and a circle through one is a circle to read), by walking the
two packages, so moving files between subpackages needs no change here. DEVELOPERS.md (*Layers*) explains the
order below.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("kvmethods", "pytest_kvbench")

# Bottom to top: a module may import from its own layer and the layers below it, never from one above.
# Each entry names packages or modules by dotted prefix; a module belongs to the layer of its longest prefix.
LAYERS = (
    # kvmethods/, by room: compression methods and generation, knowing nothing of the benchmark. The contract every
    # method and the runtime share (Method, budgets, parameters, LayerInputs, the clock, the kernel memo, the layout
    # data) and the spec grammar; transformers' calling conventions and kvpress; how kept tokens are stored; the
    # attention hooks with the model probe; the methods; the runtime that runs them; the registry at the top
    ("kvmethods.core", "kvmethods.spec"),
    ("kvmethods.adapters",),
    ("kvmethods.storage",),
    ("kvmethods.attention",),
    ("kvmethods.scorers", "kvmethods.wrappers", "kvmethods.decoding"),
    ("kvmethods.runtime",),
    ("kvmethods", "kvmethods.registry", "kvmethods.testing"),
    ("pytest_kvbench", "pytest_kvbench.input_values", "pytest_kvbench.user_paths",  # leaf helpers
     "pytest_kvbench.atomic_files", "pytest_kvbench.stats", "pytest_kvbench.hookspecs"),
    ("pytest_kvbench.model_sources", "pytest_kvbench.tasks"),  # what a model reference and a task are
    # Case, Grid, item ids and keys: what every part above runs or names (record_key.py, beside cases.py,
    # builds and parses the key for Case.key and every view, so it belongs here)
    ("pytest_kvbench.cases", "pytest_kvbench.record_key"),
    # results/, by room: the record's definition, its views (records -> text), the run directory (which
    # writes RESULTS.md through the views), then what reads whole runs (the HTML report, other projects' layouts)
    ("pytest_kvbench.results", "pytest_kvbench.results.record"),
    ("pytest_kvbench.results.views",),
    ("pytest_kvbench.results.run",),
    ("pytest_kvbench.results.report", "pytest_kvbench.results.exports", "pytest_kvbench.results.query"),
    ("pytest_kvbench.comparison",),  # baselines and verdicts over records
    ("pytest_kvbench.engine",),  # one item's work: makes a record
    ("pytest_kvbench.serving",),  # a serving engine's item (llamacpp:q8_0), over the engine's prompts and references
    # wiring/, by room: the grid read at configure, the run's own modules (wiring/*.py), then what rides on
    # the run (xdist and shards, live progress), reading its stash keys and items
    ("pytest_kvbench.wiring.grid", "pytest_kvbench.model_listing"),
    ("pytest_kvbench.wiring",),
    ("pytest_kvbench.wiring.distributed", "pytest_kvbench.wiring.progress", "pytest_kvbench.wiring.trackers"),
    ("pytest_kvbench.plugin", "pytest_kvbench.run_plugin", "pytest_kvbench.cli", "pytest_kvbench.cli_checks",  # entry points
     "pytest_kvbench.commands"),
)

# Circles allowed while they are being removed: (why, regex every member's basename matches, package). Empty:
# the last one (the kvmethods registry building wrappers that built their base through the registry again)
# went with kvmethods/spec.py (issue #29 step 3). A new entry must say why and when it goes.
KNOWN_CIRCLES: tuple[tuple[str, re.Pattern, str], ...] = ()

LAZY_COMMENT = re.compile(r"#.*\blazy\b\W+\w")  # "# lazy for startup time: torch", "# lazy: optional extra"


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int


def module_files() -> dict[str, Path]:
    """Every module of the packages, by dotted name (a package by its own name)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = module_files()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def _targets(importer: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The project modules an import statement loads (a `from package import submodule` names the submodule)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            base = importer.split(".") if MODULES[importer].name == "__init__.py" else importer.split(".")[:-1]
            base = base[: len(base) - (node.level - 1)]
            source = ".".join(base + ([node.module] if node.module else []))
        else:
            source = node.module or ""
        names = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source for alias in node.names]
    return sorted({name for name in names if name in MODULES and name != importer})


def imports() -> list[Import]:
    found = []
    for name, tree in TREES.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found += [Import(name, target, node.lineno) for target in _targets(name, node)]
    return found


def graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {name: set() for name in MODULES}
    for imp in imports():
        edges[imp.importer].add(imp.imported)
    return edges


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module: the import circles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return circles


def is_known(circle: list[str]) -> bool:
    return any(all(m.split(".")[0] == package and pattern.match(m.rsplit(".", 1)[-1]) for m in circle)
               for _, pattern, package in KNOWN_CIRCLES)


def layer_of(module: str) -> int | None:
    matches = [(len(prefix), level) for level, prefixes in enumerate(LAYERS) for prefix in prefixes
               if module == prefix or module.startswith(prefix + ".")]
    return max(matches)[1] if matches else None


def function_import_runs(source: str) -> list[tuple[int, bool]]:
    """(line, commented) for each run of consecutive import statements inside a function of `source`: the
    run is commented when one of its lines, or the comment lines right above it, says why it is lazy."""
    lines = source.splitlines()
    runs = set()
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for block in ast.walk(function):
            for field in ("body", "orelse", "finalbody"):
                statements = getattr(block, field, None)
                if not isinstance(statements, list):  # a lambda's or a conditional expression's body
                    continue
                run: list[ast.stmt] = []
                for statement in [*statements, None]:
                    if isinstance(statement, (ast.Import, ast.ImportFrom)):
                        run.append(statement)
                        continue
                    if run:
                        first = run[0].lineno - 1
                        while first > 0 and lines[first - 1].strip().startswith("#"):
                            first -= 1
                        text = "\n".join(lines[first: run[-1].end_lineno])
                        runs.add((run[0].lineno, bool(LAZY_COMMENT.search(text))))
                    run = []
    return sorted(runs)


def lazy_import_groups() -> list[tuple[str, int, bool]]:
    """(module, line, commented) for every run of imports inside a function in the packages."""
    return [(name, line, commented) for name, path in MODULES.items()
            for line, commented in function_import_runs(path.read_text())]


# -- the rules --------------------------------------------------------------------------------------------

def test_the_graph_is_read():
    """The walk sees the packages' modules and their imports (else every rule below would pass vacuously)."""
    edges = graph()
    assert {"kvmethods.core.budget", "pytest_kvbench.plugin", "pytest_kvbench.cases"} <= set(edges)
    assert "pytest_kvbench.cases" in edges["pytest_kvbench.engine.runner"]
    assert any(module.startswith("kvmethods") for module in edges["pytest_kvbench.engine.runner"])
    assert any(group[2] for group in lazy_import_groups())  # the plugin's deliberately lazy imports
    assert "pytest_kvbench.wiring.session" in edges["pytest_kvbench.wiring.stash_keys"]  # type-only, read too


def test_no_import_circles():
    circles = [circle for circle in strongly_connected(graph()) if not is_known(circle)]
    assert circles == [], "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


@pytest.mark.parametrize("why, pattern, package", KNOWN_CIRCLES, ids=[c[0] for c in KNOWN_CIRCLES])
def test_a_known_circle_is_still_there(why, pattern, package):
    """An allowance that nothing needs any more goes: delete it from KNOWN_CIRCLES."""
    assert any(is_known(circle) for circle in strongly_connected(graph())), f"{why} is gone: remove it"


def test_every_module_has_a_layer():
    assert [m for m in MODULES if layer_of(m) is None] == []


def test_no_upward_imports():
    upward = sorted({f"{imp.importer}:{imp.line} -> {imp.imported}" for imp in imports()
                     if layer_of(imp.imported) > layer_of(imp.importer)})
    assert upward == [], "imports from a higher layer (LAYERS):\n" + "\n".join(upward)


def unit_of(module: str) -> str:
    """A folder without subfolders is one unit (results/run, wiring/grid, tasks/ruler, ...); in a folder that has
    subfolders (pytest_kvbench/, tasks/, wiring/, ...) each module is its own unit."""
    path = MODULES[module]
    folder = module if path.name == "__init__.py" else module.rpartition(".")[0]
    has_subfolders = any(other.startswith(folder + ".") and MODULES[other].name == "__init__.py"
                         for other in MODULES if other != folder)
    return module if has_subfolders or not folder else folder


def arrows_back_up(package: str) -> list[str]:
    """Imports between units of `package` that lie on a circle of units: whatever order the folders are put in,
    one of these points back up (a lower folder importing a higher one)."""
    edges: dict[str, set[str]] = {}
    found: dict[tuple[str, str], str] = {}
    for imp in imports():
        if not imp.importer.startswith(package + ".") and imp.importer != package:
            continue
        a, b = unit_of(imp.importer), unit_of(imp.imported)
        if a != b:
            edges.setdefault(a, set()).add(b)
            edges.setdefault(b, set())
            found.setdefault((a, b), f"{imp.importer}:{imp.line} -> {imp.imported}")
    circles = strongly_connected(edges)
    return sorted(found[(a, b)] for circle in circles for a in circle for b in circle if (a, b) in found)


@pytest.mark.parametrize("package", PACKAGES)
def test_no_folder_imports_a_higher_one(package):
    """Not only between the layers above: inside them too (wiring/grid, wiring/progress, results/run, tasks/ruler,
    kvmethods/scorers, ...), no folder imports one that imports it back, so every folder can be read and tested
    without those above."""
    upward = arrows_back_up(package)
    assert upward == [], "imports on a circle of folders:\n" + "\n".join(upward)


def test_imports_inside_functions_say_why_they_are_lazy():
    silent = [f"{MODULES[name].relative_to(ROOT)}:{line}" for name, line, commented in lazy_import_groups()
              if not commented]
    assert silent == [], ("imports inside functions without a '# lazy ...: why' comment (startup cost, optional "
                          "extra); move them to the top otherwise:\n" + "\n".join(silent))


# -- the checker itself -----------------------------------------------------------------------------------

def test_a_folder_is_one_unit_unless_it_has_subfolders():
    assert unit_of("pytest_kvbench.results.run.writer") == "pytest_kvbench.results.run"
    assert unit_of("pytest_kvbench.wiring.session") == "pytest_kvbench.wiring.session"
    assert unit_of("pytest_kvbench.tasks.registry") == "pytest_kvbench.tasks.registry"
    assert unit_of("pytest_kvbench.cases") == "pytest_kvbench.cases"
    assert unit_of("kvmethods.scorers.snapkv") == "kvmethods.scorers"
    assert unit_of("kvmethods.runtime.generation") == "kvmethods.runtime.generation"  # runtime/ has protocols/


def test_tarjan_finds_circles_and_only_them():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(edges) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_layers_put_a_module_under_its_longest_prefix():
    assert layer_of("pytest_kvbench.engine.hardware.sampler") == layer_of("pytest_kvbench.engine")
    assert layer_of("pytest_kvbench.input_values") < layer_of("pytest_kvbench.cases") < layer_of(
        "pytest_kvbench.engine") < layer_of("pytest_kvbench.wiring") < layer_of("pytest_kvbench.plugin")
    assert layer_of("pytest_kvbench.results.record") < layer_of("pytest_kvbench.results.views.tables") < layer_of(
        "pytest_kvbench.results.run.writer") < layer_of("pytest_kvbench.results.report.html_report")
    assert layer_of("pytest_kvbench.wiring.grid.options") < layer_of("pytest_kvbench.wiring.session") < layer_of(
        "pytest_kvbench.wiring.progress.live")
    assert layer_of("kvmethods.core.layer_inputs") == layer_of("kvmethods.spec") == 0
    assert layer_of("kvmethods.core.budget") < layer_of("kvmethods.adapters.transformers_compat") < layer_of(
        "kvmethods.storage.ragged") < layer_of("kvmethods.attention.model_probe") < layer_of(
        "kvmethods.scorers.snapkv") == layer_of("kvmethods.wrappers.adakv") == layer_of(
        "kvmethods.decoding.rkv") < layer_of("kvmethods.runtime.protocols.multi_turn") < layer_of(
        "kvmethods.registry") == layer_of("kvmethods") < layer_of("pytest_kvbench")
    assert layer_of("elsewhere") is None


def test_an_import_inside_a_function_needs_a_lazy_comment_on_it_or_above_it():
    source = """
def plain():
    import json

    return json


def commented():
    # lazy for startup time: torch
    import torch
    from torch import nn

    return torch, nn


def trailing():
    if True:
        import numpy  # lazy: optional extra

    x = 1
    import scipy
    return x


def not_a_reason():
    import yaml  # lazy
    return yaml
"""
    assert function_import_runs(source) == [(3, False), (10, True), (18, True), (21, False), (26, False)]

