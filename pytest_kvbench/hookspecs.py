"""Hooks that pytest-kvbench adds to pytest (registered with ``pytest_addhooks``).

Implement them in a conftest.py or a plugin to send results elsewhere (a tracker, a database)
without touching the harness: the plugin's own implementation is just one more listener.
"""

import pytest


@pytest.hookspec
def pytest_kvbench_record(record: dict, item: pytest.Item) -> None:
    """Called once per finished benchmark item, in the process that ran it.

    ``record`` is the JSON object of the item's result (``Record.to_json()``: fields in DEVELOPERS.md,
    ``schema_version`` included), with its final ``status`` already set; ``Record.from_json(record)`` types
    it (docs/records.md). It is called for passed, failed, skipped and errored items.
    """
