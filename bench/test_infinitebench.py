"""InfiniteBench: one item per (method, budget, task) of the grid, for its 12 tasks."""

import pytest

pytestmark = pytest.mark.infinitebench


def test_infinitebench(kvbench_case, kvbench):
    record = kvbench.run(kvbench_case)
    kvbench.check(record)
