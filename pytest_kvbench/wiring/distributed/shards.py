"""Across machines: ``--kvbench-shard K/N`` picks part K of N of the items, models kept together.

Deterministic and machine-independent, so N machines given the same grid run every item once. The plugin's
collection hook (plugin.py) cuts what would run unsharded: after -k / -m and the default selection.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence


def shard_cuts(group_sizes: Sequence[int], n: int, slack: float = 0.1) -> list[int]:
    """Where to cut ``sum(group_sizes)`` items, laid out group after group, into ``n`` parts.

    Parts get an even share (sizes differ by at most one), except that a cut moves to a group
    boundary when every part stays within ``slack`` of a share (plus one item) of its even
    size: one model fewer to load on a machine is worth a slightly uneven split, a machine
    idling for hours is not. Returns ``n + 1`` non-decreasing offsets from 0 to the total.
    """
    if not 0 <= slack < 0.5:
        raise ValueError(f"slack must be in [0, 0.5), got {slack}")
    total = sum(group_sizes)
    boundaries = [0]
    for size in group_sizes:
        boundaries.append(boundaries[-1] + size)
    tolerance = int(slack * total / n + 1e-9)  # floor, robust to 0.3 * 210 / 9 = 7.000...1 vs 6.999...
    smallest, largest = total // n - tolerance, -(-total // n) + tolerance
    cuts = [0]
    for i in range(1, n):
        even = (i * total) // n
        candidates = sorted((b for b in boundaries if abs(b - even) <= tolerance), key=lambda b: (abs(b - even), b))
        cut = next((b for b in candidates if smallest <= b - cuts[-1] <= largest), even)
        cuts.append(max(cut, cuts[-1]))
    cuts.append(total)
    return cuts


def select_shard(items: Iterable, k: int, n: int, group_key: Callable[[object], object], *,
                 item_key: Callable[[object], object] | None = None, slack: float = 0.1) -> list:
    """Part ``k`` of ``n`` (1-based) of ``items``, keeping each group (model) together if possible.

    Deterministic and machine-independent (no ``hash()``, no randomness): groups are ordered by
    ``str(group_key(item))``, items inside a group by ``item_key`` (e.g. the node id; default:
    their given order), then the sequence is cut by ``shard_cuts``. Shards 1..n together hold
    every item exactly once. The selected items keep their original relative order.
    """
    if not (n >= 1 and 1 <= k <= n):
        raise ValueError(f"shard {k}/{n} is out of range: need 1 <= K <= N")
    items = list(items)
    groups: dict[str, list[int]] = {}
    for position, item in enumerate(items):
        groups.setdefault(str(group_key(item)), []).append(position)
    layout: list[int] = []
    sizes: list[int] = []
    for name in sorted(groups):
        members = groups[name]
        if item_key is not None:
            members = sorted(members, key=lambda p: (str(item_key(items[p])), p))
        layout.extend(members)
        sizes.append(len(members))
    cuts = shard_cuts(sizes, n, slack)
    chosen = set(layout[cuts[k - 1]:cuts[k]])
    return [item for position, item in enumerate(items) if position in chosen]
