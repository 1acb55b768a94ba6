"""Keeping the items that share a full-cache reference on one xdist worker (``--dist loadgroup``).

``xdist_group_name`` names the ``xdist_group`` mark of a group of items (one model, task, length
and seed: ``Case.reference_group``); ``reference_group_scheduler`` is xdist's ``loadgroup``
scheduler told each item's group directly by the controller, from the items the workers collected
(a group cut into parts for idle workers: group_parts.py).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence

_GROUP_UNSAFE = re.compile(r"[^A-Za-z0-9._/+=-]")


def xdist_group_name(group: str) -> str:
    """The ``xdist_group`` name for a group of items (``Case.reference_group``), so that
    ``--dist loadgroup`` keeps them on one worker.

    Grouping by model alone would send a one-model sweep to a single worker; grouping by the
    reference a task's items share spreads tasks over workers while each full-cache reference
    is still computed once per run, and each worker loads only the models of its groups.

    xdist appends ``@<group>`` to node ids and splits on the last ``@`` after the last ``]``,
    so the name must contain neither; anything outside a conservative set becomes ``_``.
    """
    return "kvbench_" + _GROUP_UNSAFE.sub("_", group)


def parametrize_id(nodeid: str) -> str | None:
    """``path::test_ruler[snapkv-128-vt-ctx2048]`` (with or without xdist's ``@group``) -> the id."""
    if nodeid.rfind("@") > nodeid.rfind("]"):
        nodeid = nodeid[: nodeid.rfind("@")]
    start = nodeid.find("[", nodeid.rfind("::") + 2)
    if start < 0 or not nodeid.endswith("]"):
        return None
    return nodeid[start + 1 : -1]


def reference_group_scheduler(config, log, groups_of: Callable[[Sequence[str], int], Mapping[str, str]]):
    """xdist's ``loadgroup`` scheduler, told each kvbench item's group directly.

    xdist passes ``xdist_group`` marks to the controller by appending ``@group`` to node ids in
    the workers; from pytest 9.2 that rename no longer takes effect (pytest-xdist issue #1386),
    and ``--dist loadgroup`` silently spreads a task's items over every worker. The controller
    knows the grid, so once the workers' collections are in it maps each collected item's parametrize
    id to its group (``groups_of(ids, workers)``: the selected items decide how many groups there are
    and so whether a group is cut into parts); items that are not kvbench cases keep xdist's own rule.
    """
    # lazy: xdist is optional; only with --dist loadgroup
    from xdist.scheduler import LoadGroupScheduling

    class ReferenceGroupScheduling(LoadGroupScheduling):
        groups: Mapping[str, str] = {}

        def schedule(self) -> None:
            if self.collection is None and self.collection_is_completed:  # the first, initial distribution
                collected = next(iter(self.registered_collections.values()), [])
                self.groups = groups_of([i for i in map(parametrize_id, collected) if i is not None], self.numnodes)
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            group = self.groups.get(parametrize_id(nodeid) or "")
            return group if group is not None else super()._split_scope(nodeid)

        def add_node_collection(self, node, collection) -> None:
            super().add_node_collection(node, collection)
            if node not in self.registered_collections:  # a replacement worker whose collection xdist refused
                self.refused = getattr(self, "refused", set()) | {node}

        def _reschedule(self, node) -> None:
            """xdist's loadscope hands work to every node, a replacement worker (after a crash) whose collection
            it did not register included: an INTERNALERROR (KeyError) that ended the run unlabelled. Such a node
            gets no work: it is told to stop if its collection was refused, and waits if it is still collecting;
            a group that no worker can take is then simply not run (the run names its items as not finished)."""
            if node in getattr(self, "refused", set()):
                if not node.shutting_down:
                    node.shutdown()
                return
            if node not in self.registered_collections:
                return
            super()._reschedule(node)

    return ReferenceGroupScheduling(config, log)
