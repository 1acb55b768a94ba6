"""What the CI gates cover of the product: every built-in method, budget kind and protocol, by the gate entry
that can fail on it (``kvbench coverage``).

A gate only guards what its entries run, and only where an entry has power (comparison/power.py): issue 50 found
bugs in expected_attention, the ratio budget, `random`'s seeding and the multi-turn protocol passing both gates,
because no entry ran them. So CI reads every gate's baseline file (``results/baseline-*.json``: one per gate) and
builds the matrix method x budget kind x protocol: which entry covers each cell, and the smallest change it detects
(its score drop from power.py at the default tolerances, or the fidelity metrics that gate it). A built-in method,
a budget kind or a protocol that no entry with power covers is a gap; the verb exits 1 on any gap.

Only `NOT_GATED` is exempt, each with its reason (a method whose backend CI does not install); it is printed.
Nothing here imports torch: the method catalog and the protocols are plain tables (kvmethods/core/catalog.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kvmethods.core.catalog import BUILTINS, PROTOCOLS
from pytest_kvbench.comparison.baseline_file import Baseline
from pytest_kvbench.comparison.power import Power, entry_power
from pytest_kvbench.comparison.tolerances import Tolerances
from pytest_kvbench.record_key import DEFAULT_PROTOCOL

# budget kinds (BudgetInfo.kind) and how the matrix names them; "none" is the full cache's own column
BUDGET_KINDS = {"tokens": "absolute", "ratio": "ratio rX", "memory": "bytes mF"}
FULL_KIND = "none"
# Built-in methods no CI gate can run, and why (printed with the matrix; not counted as gaps).
NOT_GATED = {"hf_quantized": "its backends (optimum-quanto, hqq) are optional extras that CI does not install; "
                             "its tests skip without them (docs/install.md)"}
BASELINE_GLOB = "baseline*.json"


@dataclass(frozen=True)
class Cover:
    """One gate entry as a cell of the matrix: the method it runs, its budget kind and protocol, its power."""

    gate: str  # the baseline file's name without "baseline-" and ".json"
    method: str
    budget_kind: str
    protocol: str
    power: Power

    @property
    def detects(self) -> str:
        """The smallest change the entry detects, in words: 'score -15.0 pts, kl' or '- (why)'."""
        parts = ([f"score -{self.power.score_drop:.1f} pts"] if self.power.score_drop is not None else []) + (
            ["/".join(self.power.fidelity)] if self.power.fidelity else [])
        return ", ".join(parts) if parts else f"- ({self.power.score_why}; {self.power.fidelity_why})"

    def rank(self) -> tuple:
        """Sort key: entries that can fail first, then the smallest detectable score drop, then most fidelity."""
        drop = self.power.score_drop if self.power.score_drop is not None else float("inf")
        return (not self.power.can_fail, drop, -len(self.power.fidelity), self.gate, self.power.key)


def gate_name(path: str | Path) -> str:
    stem = Path(path).stem
    return stem.removeprefix("baseline-") if stem != "baseline" else stem


def methods_of(name: str) -> list[str]:
    """The built-in methods an entry's method runs: each part of a composition (snapkv+kivi)."""
    return [part for part in name.split("+") if part]


def covers(baselines: dict[str, Baseline], tolerances: Tolerances, seed: int = 0) -> list[Cover]:
    """Every (gate entry, method it runs) pair as a cell; gate name -> its baseline."""
    out = []
    for gate, baseline in sorted(baselines.items()):
        for entry in sorted(baseline.entries.values(), key=lambda e: e.key):
            power = entry_power(entry, tolerances, seed)
            kind = (entry.budget.kind if entry.budget is not None else None) or FULL_KIND
            method = entry.method.name if entry.method is not None else entry.key.split("|")[1]
            for part in methods_of(method):
                out.append(Cover(gate, part, kind, entry.protocol or DEFAULT_PROTOCOL, power))
    return out


@dataclass(frozen=True)
class Gaps:
    """What no entry with power covers."""

    methods: tuple[str, ...]
    budget_kinds: tuple[str, ...]
    protocols: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.methods or self.budget_kinds or self.protocols)


def gaps(cells: Iterable[Cover], methods: Iterable[str] = BUILTINS) -> Gaps:
    powered = [c for c in cells if c.power.can_fail]
    seen_methods = {c.method for c in powered}
    return Gaps(tuple(m for m in sorted(methods) if m not in seen_methods and m not in NOT_GATED),
                tuple(k for k in BUDGET_KINDS if k not in {c.budget_kind for c in powered}),
                tuple(p for p in PROTOCOLS if p not in {c.protocol for c in powered}))


def best_by_cell(cells: Iterable[Cover]) -> dict[tuple[str, str, str], Cover]:
    """(method, protocol, budget kind) -> the most powerful entry of that cell."""
    best: dict[tuple[str, str, str], Cover] = {}
    for cell in cells:
        where = (cell.method, cell.protocol, cell.budget_kind)
        if where not in best or cell.rank() < best[where].rank():
            best[where] = cell
    return best


def matrix_rows(cells: list[Cover], methods: Iterable[str] = BUILTINS) -> list[list[str]]:
    """One row per (method, protocol) with an entry, one per method without any: the best entry of each budget
    kind as 'gate: key-less summary' (the method's full-cache column for `full`)."""
    best = best_by_cell(cells)
    rows = []
    for method in sorted(methods):
        protocols = sorted({p for (m, p, _) in best if m == method}, key=PROTOCOLS.index) or [None]
        for protocol in protocols:
            row = [method, protocol or "-"]
            for kind in (*BUDGET_KINDS, FULL_KIND):
                cell = best.get((method, protocol, kind))
                row.append(f"{cell.gate}: {cell.detects}" if cell else "")
            if protocol is None:
                row[2] = "NOT GATED (below)" if method in NOT_GATED else "UNCOVERED: no gate entry"
            rows.append(row)
    return rows


MATRIX_HEADERS = ["method", "protocol", *BUDGET_KINDS.values(), "full cache"]


def gaps_message(found: Gaps) -> str:
    """One line: what no gate entry with power covers, or that everything is covered."""
    if not found:
        return "every built-in method, budget kind and protocol is covered by a gate entry that can fail"
    parts = [f"{what}: {', '.join(names)}" for what, names in (
        ("methods", found.methods), ("budget kinds", [BUDGET_KINDS[k] for k in found.budget_kinds]),
        ("protocols", found.protocols)) if names]
    return "not covered by any gate entry that can fail: " + "; ".join(parts)


def as_json(cells: list[Cover], found: Gaps, files: dict[str, str]) -> dict:
    """What `kvbench coverage --json` prints: the gates, every cell with its best entry, the gaps, the exemptions."""
    return {
        "gates": files,
        "cells": [{"method": m, "protocol": p, "budget_kind": k, "gate": c.gate, "entry": c.power.key,
                   "samples": c.power.n, "score_drop": c.power.score_drop, "fidelity": list(c.power.fidelity),
                   "can_fail": c.power.can_fail}
                  for (m, p, k), c in sorted(best_by_cell(cells).items())],
        "uncovered": {"methods": list(found.methods), "budget_kinds": list(found.budget_kinds),
                      "protocols": list(found.protocols)},
        "not_gated": dict(NOT_GATED),
    }
