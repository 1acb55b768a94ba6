"""The pytest id of each benchmark item: the harness's own (`Case.id`), or what the pytest_kvbench_item_id hook
returns for its case (a shorter id, a tag in it).

Named once per session for every case of the grid (every suite), in each process alike, so that a node id maps
back to its case the same way everywhere: items.case_of_nodeid, xdist's scheduler (distributed/xdist_hooks.py),
the progress board. The hook renames the id only, never the record's key: the gate, baselines and
--kvbench-resume match items by key (record_key.py), so a renamed id keeps its baseline entry and its finished
record. An id that two items share would map a node id to either; pytest would also number them (`x0`, `x1`)
behind the hook's back. Such an id, and one pytest would escape or one a node id cannot carry (`[`, `]`, `::`),
is a usage error naming the items.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pytest_kvbench.cases import Case
from pytest_kvbench.tasks.registry import SUITES, suite_of
from pytest_kvbench.wiring.stash_keys import ITEM_IDS_KEY, SESSION_KEY

_NOT_IN_AN_ID = ("[", "]", "::")


@dataclass(frozen=True)
class ItemIds:
    """Both directions: case key -> item id, item id -> case."""

    by_key: dict[str, str]
    cases: dict[str, Case]


def item_ids(config: pytest.Config) -> ItemIds:
    """Every case's item id, asked of the hook once per session (a usage error for a bad or shared id)."""
    known = config.stash.get(ITEM_IDS_KEY, None)
    if known is None:
        grid = config.stash[SESSION_KEY].grid
        cases = [case for suite in SUITES for case in grid.cases(suite, suite_of)]
        by_key = {case.key: _asked(config, case) for case in cases}
        by_id: dict[str, Case] = {}
        for case in cases:
            named = by_key[case.key]
            if named in by_id:
                raise pytest.UsageError(f"pytest_kvbench_item_id: {named!r} names two items ({by_id[named].key} and "
                                        f"{case.key}); return a different id for each")
            by_id[named] = case
        known = config.stash[ITEM_IDS_KEY] = ItemIds(by_key, by_id)
    return known


def item_id(config: pytest.Config, case: Case) -> str:
    """The case's pytest id (its own id for a case outside the grid: a test that builds one and runs it)."""
    return item_ids(config).by_key.get(case.key, case.id)


def _asked(config: pytest.Config, case: Case) -> str:
    answer = config.hook.pytest_kvbench_item_id(case=case, default=case.id, config=config)
    if answer is None:
        return case.id
    if not isinstance(answer, str) or not answer or not answer.isascii() or not answer.isprintable() \
            or any(part in answer for part in _NOT_IN_AN_ID):
        raise pytest.UsageError(f"pytest_kvbench_item_id: {answer!r} for {case.key} is not an item id: return a "
                                f"non-empty string of printable ASCII without '[', ']' or '::'")
    return answer
