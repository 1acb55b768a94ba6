"""Reasoning (MATH-500, AIME 2024/2025): one item per (method, budget, task) of the grid.

Needs the ``reasoning`` extra (math-verify). Generation is long by default (32,768 tokens);
``--kvbench-tasks math500:max_new_tokens=4096`` shortens it.
"""

import pytest

pytestmark = pytest.mark.reasoning


def test_reasoning(kvbench_case, kvbench):
    record = kvbench.run(kvbench_case)
    kvbench.check(record)
