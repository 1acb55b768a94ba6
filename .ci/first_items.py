"""A pytest plugin for .ci/readme_commands.py: run only the first items a command selects in each test file.

Why: README's commands are run as written, but some select hundreds of items (``-m ruler`` over two context
lengths); CI runs the first KVBENCH_README_ITEMS_PER_FILE of each file (each suite, the kernel benchmarks), after
every other plugin's selection (-k, -m, the default selection), so what runs is what the command would run first,
in every part it touches. Loaded with ``-p first_items`` (.ci/ on PYTHONPATH); the items cut are reported as
deselected, as pytest reports its own.
"""

from __future__ import annotations

import os

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    result = yield
    per_file = int(os.environ.get("KVBENCH_README_ITEMS_PER_FILE") or 0)
    if per_file:
        kept, cut, seen = [], [], {}
        for item in items:
            path = item.nodeid.split("::", 1)[0]
            seen[path] = seen.get(path, 0) + 1
            (kept if seen[path] <= per_file else cut).append(item)
        if cut:
            config.hook.pytest_deselected(items=cut)
            items[:] = kept
    return result
