"""Cutting reference groups into parts for xdist workers that would otherwise idle.

The items of a reference group (`Case.reference_group`: one model, task, length and seed) share one forward per
sample, so `--dist loadgroup` keeps them on one worker. A run with fewer groups than workers leaves the others
idle: the real-model job is one group on a 2-core machine, and `-k "snapkv and qasper" -n 4` on a four-GPU node
is one group on four GPUs. Then each group is cut into as many parts as it has workers to itself, and each part
shares its prefills as a group of its own: its worker repeats the group's forward and full-cache reference (the
same computation on the same inputs, so every record is what one worker would have written) and serves the
part's items from them. A method's items stay in one part: its budgets share work beyond the forward (kvzip
scores the context once for all of them). Parts are balanced by cost, the costliest method first, each to the
cheapest part so far. An item costs 1 (its selection and its share of the batched decodes); a method that scores
the whole prompt (kvzip: `Capability.SCORES_WHOLE_PROMPT`) adds `WHOLE_PROMPT_PASS` for its scoring pass, which its
budgets share: repeat forwards over the context that attend to twice its keys. Measured on the real-model job
(SmolLM2-135M, niah_single_1 at 2,048 tokens, `-n 2`, one thread per worker; the records' timers): kvzip's pass
15.2 s per sample, any other item 0.6-0.8 s, so the pass is worth about 20 items. Cut by item count alone,
kvzip sat beside five other methods and that worker took 909 s while the other was done after 673; at 30 items'
worth kvzip had a worker to itself (799 s) and the other 30 items took 859 s (docs/performance.md).

The controller (to schedule: xdist_groups.reference_group_scheduler) and every worker (to plan its prefills,
engine/sample_outcomes.py, and its ETA) compute the same parts from the same facts: the items selected (after -k,
--lf, shards, resume) and the number of workers. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvmethods import Capability, describe_method
from pytest_kvbench.cases import Case

WHOLE_PROMPT_PASS = 20  # items' worth: a whole-prompt scorer's pass per sample (see above)


def sharing_groups(cases: Iterable[Case], workers: int) -> dict[str, str]:
    """Each case's key -> the name of the group whose prefills it shares: its reference group, or a part of it
    (``<reference group>|part2of3``) when the run has at least twice as many workers as groups."""
    groups: dict[str, list[Case]] = {}
    for case in cases:
        groups.setdefault(case.reference_group, []).append(case)
    parts = max(1, workers // len(groups)) if groups else 1
    names: dict[str, str] = {}
    for group, members in groups.items():
        cut = _split_by_method(members, parts)
        for part, part_cases in enumerate(cut):
            suffix = f"|part{part + 1}of{len(cut)}" if len(cut) > 1 else ""
            names.update({case.key: group + suffix for case in part_cases})
    return names


def method_cost(items: list[Case]) -> int:
    """What one method's items of a group cost a part, in items' worth (see above)."""
    spec = items[0].method
    capabilities = describe_method(spec.name, **spec.param_dict).capabilities
    return len(items) + (WHOLE_PROMPT_PASS if Capability.SCORES_WHOLE_PROMPT in capabilities else 0)


def _split_by_method(members: list[Case], parts: int) -> list[list[Case]]:
    """Whole methods into at most `parts` lists of nearly equal cost: the costliest method first, each to the
    cheapest part so far (ties: the lower part); methods of one cost in name order, so the cut does not depend
    on the order the items were collected in."""
    methods: dict[str, list[Case]] = {}
    for case in members:
        methods.setdefault(case.method.label, []).append(case)
    count = min(parts, len(methods))
    cut: list[list[Case]] = [[] for _ in range(count)]
    costs = [0] * count
    for label, items in sorted(methods.items(), key=lambda entry: (-method_cost(entry[1]), entry[0])):
        part = costs.index(min(costs))
        cut[part].extend(items)
        costs[part] += method_cost(items)
    return cut
