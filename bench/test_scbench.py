"""SCBench shared-context tasks: one item per (method, budget, task); each of a context's
questions is its own sample until the shared-context protocols exist (issue #17)."""

import pytest

pytestmark = pytest.mark.scbench


def test_scbench(kvbench_case, kvbench):
    record = kvbench.run(kvbench_case)
    kvbench.check(record)
