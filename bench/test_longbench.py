"""LongBench (and LongBench-E): one item per (method, budget, task) of the configured grid.

The grid comes from --kvbench-* options, ini keys or --kvbench-config; see docs/options.md.
"""

import pytest

pytestmark = pytest.mark.longbench


def test_longbench(kvbench_case, kvbench):
    record = kvbench.run(kvbench_case)
    kvbench.check(record)
