"""Hooks that pytest-kvbench adds to pytest (registered with ``pytest_addhooks``).

Implement them in a conftest.py or a plugin to send results elsewhere (a tracker, a database)
without touching the harness: the plugin's own implementation is just one more listener.
"""

import pytest


@pytest.hookspec
def pytest_kvbench_environment(environment: dict, config: pytest.Config) -> dict | None:
    """Fields of your own for the run's environment block; return a dict (or None).

    Called once per run, in the controller, when the run's environment is captured (git commit, versions,
    command line, host: ``environment``, to read, not change). The returned keys join that block in run.json
    (``environment``) and in every export that carries it (``kvbench export --format json``). A key the block
    already has is refused: name yours otherwise. Example: docs/results.md, *Fields, columns and ids of your own*.
    """


@pytest.hookspec
def pytest_kvbench_results_columns(config: pytest.Config) -> dict | None:
    """Columns of your own for RESULTS.md's tables; return ``{header: function}`` (or None).

    Called once, at configure, in the controller. Each function is given one row's records (a method's records
    in one model and budget table, ``list[Record]``) and returns the cell's text (None: ``-``); the columns
    follow the table's own, in the order returned. A header the tables already use (``KL``, ``Avg``, ...) is a
    usage error. Example: docs/results.md, *Fields, columns and ids of your own*.
    """


@pytest.hookspec(firstresult=True)
def pytest_kvbench_item_id(case, default: str, config: pytest.Config) -> str | None:
    """The pytest id of a benchmark item (``bench/test_ruler.py::test_ruler[<id>]``); return a str, or None to
    leave ``default`` (the harness's own id, ``Case.id``: ``snapkv-128-niah_single_1-ctx4096``).

    ``case`` is the item's ``pytest_kvbench.cases.Case`` (its ``method``, ``budget``, ``task``,
    ``context_length``, ``seed``, ``model``, ``protocol``, ``key``). Called once per case of the grid, in every
    process, before the items are collected; the first non-None answer wins. The id is what pytest prints, what
    ``-k`` matches, the record's ``item_id`` and the run's lists of items; the record's ``key`` (what the gate,
    baselines and ``--kvbench-resume`` match items by) never changes with it. Two items given one id, or an id
    that is empty, not printable ASCII or holds ``[``, ``]`` or ``::``, is a usage error. Example:
    docs/results.md, *Fields, columns and ids of your own*.
    """


@pytest.hookspec
def pytest_kvbench_record_fields(record: dict, item: pytest.Item) -> dict | None:
    """Fields of your own for an item's record, before it is written and passed on; return a dict (or None).

    Called once per finished benchmark item, in the process that ran it, before ``pytest_kvbench_record``.
    ``record`` is the record's JSON object as it stands (read it, do not change it). The returned keys join
    the record's ``extra``: written at the record's top level in records.jsonl and run.json, kept by every
    reader (merge, resume, ``kvbench export --format json``), typed back as ``Record.from_json(...).extra``. A
    key the record itself declares (``score``, ``model``, ...) is refused: name yours otherwise. Example and
    rules: docs/results.md, *Fields, columns and ids of your own*.
    """


@pytest.hookspec
def pytest_kvbench_record(record: dict, item: pytest.Item) -> None:
    """Called once per finished benchmark item, in the process that ran it.

    ``record`` is the JSON object of the item's result (``Record.to_json()``: fields in DEVELOPERS.md,
    ``schema_version`` included), with its final ``status`` already set; ``Record.from_json(record)`` types
    it (docs/records.md). It is called for passed, failed, skipped and errored items.
    """
