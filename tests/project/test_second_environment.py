"""The transformers_independent marker (tests/conftest.py) keeps a test out of CI's second environment
(.ci/kvpress-env.sh, transformers 5.2): only tests whose outcome cannot depend on the transformers version may carry
it. A module that imports transformers, kvpress or the tiny/GGUF model builders is never such a test."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

TESTS = Path(__file__).resolve().parents[1]
VERSION_BOUND = ("transformers", "kvpress", "tiny_models", "model_helpers", "gguf_helpers")


def marked(tree: ast.Module) -> bool:
    """The module's pytestmark (or one of its tests) names transformers_independent."""
    return any(isinstance(node, ast.Attribute) and node.attr == "transformers_independent" for node in ast.walk(tree))


def imported(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "importorskip" and node.args:
            names.add(str(getattr(node.args[0], "value", "")).split(".")[0])
    return names


def test_no_marked_module_imports_transformers_kvpress_or_a_model_builder():
    offending = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        if marked(tree) and imported(tree) & set(VERSION_BOUND):
            offending[str(path.relative_to(TESTS))] = sorted(imported(tree) & set(VERSION_BOUND))
    assert offending == {}


def test_the_check_sees_a_marked_module_that_imports_transformers():
    tree = ast.parse("import pytest\nfrom transformers import AutoConfig\n"
                     "pytestmark = pytest.mark.transformers_independent\n")
    assert marked(tree) and imported(tree) & set(VERSION_BOUND) == {"transformers"}
