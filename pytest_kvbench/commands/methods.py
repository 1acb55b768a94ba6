"""``kvbench methods``: every built-in method, what kind it is, its parameters, its paper, its kvpress press and
the families that refuse it, before anything runs.

A user picking methods for a grid should not have to read the source to learn that `chunkkv` takes a `base`, that
`kivi`'s bits are 2 or 4 or that `expected_attention` cannot run on phi3. Everything here comes from the method
catalog (kvmethods/core/catalog.py, generated from the classes) and the family facts (kvmethods/core/family_table.py)
through the one refusal rule table (core/layout.refusal): no method is imported, and neither is torch.
"""

from __future__ import annotations

import json

from tabulate import tabulate

from kvmethods.core.capabilities import Capability
from kvmethods.core.catalog import BUILTINS, KVPRESS_PREFIX, MethodEntry
from kvmethods.core.layout import COMPRESS, KEEP, refusal
from kvmethods.core.family_table import FAMILIES, tested_layout

# The kind a method is, by what it declares: the first row whose flags it has.
KINDS = ((Capability.WRAPS, "wrapper"), (Capability.COMPRESSES_WHILE_DECODING, "compresses while decoding"),
         (Capability.OWN_STORAGE, "storage"), (Capability.KEEPS_LAYERS_WHOLE, "per-layer selector"),
         (Capability.SCORES_WHOLE_PROMPT, "whole-prompt scorer"),
         (Capability.LAYER_SCORES, "scorer"), (Capability.COMPRESSES, "selector"))


def kind_of(capabilities: Capability) -> str:
    """wrapper, compresses while decoding, storage (quantizers, channel pruning), per-layer selector (some layers
    kept whole), whole-prompt scorer, scorer, selector (positions without scores), or reference (keeps everything)."""
    return next((kind for flag, kind in KINDS if flag in capabilities), "reference")


def refused_by(entry: MethodEntry, sliding: str) -> dict[str, str]:
    """family -> the one-line reason, for each tested family that refuses the method (run with `sliding`)."""
    reasons = {family: refusal(tested_layout(family), entry.capabilities, sliding) for family in FAMILIES}
    return {family: reason for family, reason in reasons.items() if reason}


def listing() -> list[dict]:
    """One dict per built-in method, by name: what `kvbench methods --json` prints."""
    rows = []
    for name in sorted(BUILTINS):
        entry = BUILTINS[name]
        kept = refused_by(entry, KEEP)
        rows.append({
            "name": name, "kind": kind_of(entry.capabilities), "paper": entry.paper or None,
            "params": [{"name": spec.name, "type": spec.kind.__name__, "default": spec.default,
                        "range": spec.value_range(), "help": spec.help} for spec in entry.params],
            "kvpress_press": entry.kvpress_press or None, "kvpress_name": entry.kvpress_name or None,
            "capabilities": [flag.name for flag in Capability if flag in entry.capabilities],
            "refused_by": kept,
            "refused_with_sliding_compress": {family: reason for family, reason in refused_by(entry, COMPRESS).items()
                                              if family not in kept},
        })
    return rows


def _params_cell(params: list[dict]) -> str:
    return ", ".join(f"{p['name']}={p['default']}" + (f" ({p['range']})" if p["range"] else "") for p in params) or "-"


def cmd_methods(args) -> int:
    rows = listing()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [[r["name"], r["kind"], _params_cell(r["params"]), r["paper"] or "-", r["kvpress_press"] or "-",
              ", ".join(r["refused_by"]) or "-"] for r in rows]
    print(tabulate(table, headers=["method", "kind", "parameters (defaults)", "paper", "kvpress", "refused by"],
                   tablefmt="github", disable_numparse=True))
    print(f"\n{len(rows)} built-in methods; any kvpress press runs as {KVPRESS_PREFIX}<Press> (the [kvpress] extra). "
          "Why a family refuses a method: kvbench methods --json (refused_by).")
    return 0


def add_parser(sub, common) -> None:
    p = sub.add_parser("methods", parents=[common], help="list every built-in method: kind, parameters with defaults "
                                                          "and ranges, paper, kvpress press, refusing families")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_methods)
