"""LongBench v2: one item per (method, budget, task) of the grid; ``longbench_v2`` answers directly,
``longbench_v2_cot`` reasons first (see pytest_kvbench/tasks/longbench_v2/task.py)."""

import pytest

pytestmark = pytest.mark.longbench_v2


def test_longbench_v2(kvbench_case, kvbench):
    record = kvbench.run(kvbench_case)
    kvbench.check(record)
