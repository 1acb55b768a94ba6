"""SCBench shared-context tasks: one item per (method, budget, task); each turn of a context's
conversation is a sample (its prompt holds the gold answers of the turns before), scored per turn."""

import pytest

pytestmark = pytest.mark.scbench


def test_scbench(kvbench_case, kvbench):
    record = kvbench.run(kvbench_case)
    kvbench.check(record)
