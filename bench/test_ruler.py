"""RULER synthetic tasks: one item per (method, budget, task, context length) of the grid."""

import pytest

pytestmark = pytest.mark.ruler


def test_ruler(kvbench_case, kvbench):
    record = kvbench.run(kvbench_case)
    kvbench.check(record)
