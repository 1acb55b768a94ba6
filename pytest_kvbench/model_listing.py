"""``kvbench models``: the named models, their sources and which one ``--kvbench-model NAME`` uses here.

A user about to run ``--kvbench-model smollm2-135m`` should see before the run whether it will
load the hub's float weights or a GGUF file, or what to install; the names come from
model_sources/named_models.toml.
"""

from __future__ import annotations

import json

from tabulate import tabulate
from pytest_kvbench.model_sources.named_models import listing


def cmd_models(args) -> int:
    rows = listing()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [[r["name"], r["resolves_to"] or f"nothing: {r['install']}",
              (r["hub"] or "-") + (" (cached)" if r["hub_cached"] else ""),
              r["gguf"] + (" (installed)" if r["gguf_installed"] else ""), r["description"]] for r in rows]
    print(tabulate(table, headers=["name", "uses here", "hub", "GGUF file", "model"], tablefmt="github"))
    return 0


def add_parser(sub, common) -> None:
    p = sub.add_parser("models", parents=[common],
                       help="list the named models (--kvbench-model NAME), their sources and which is available here")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_models)
