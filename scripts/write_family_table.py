"""Write docs/models.md's family x method table from the family descriptions (kvmethods/core/family_table.py).

Each row is a family of kvmethods/testing.py's tiny models described from its config alone (core/family_table.layout_of, the
same description the startup check uses, which tests/kvmethods/test_families.py checks against the probe of a
loaded model), and each built-in method is asked the one rule table (core/layout.refusal). The table sits
between two markers in docs/models.md; `python scripts/write_family_table.py` rewrites it there, `--check` exits 1
when it is out of date (tests/kvmethods/test_families.py runs the check).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvmethods.core.catalog import BUILTINS
from kvmethods.core.layout import COMPRESS, SLIDING, refusal
from kvmethods.core.family_table import FAMILIES, layout_of
from kvmethods.testing import FAMILIES as TESTED, family_config

ROOT = Path(__file__).resolve().parents[1]

DOC = ROOT / "docs" / "models.md"
START, END = "<!-- family-table: written by scripts/write_family_table.py -->", "<!-- family-table end -->"


def table() -> str:
    methods = sorted(BUILTINS)
    lines = ["| family | layers (tiny test model) | queries | what is special | refused methods (why) |",
             "| --- | --- | --- | --- | --- |"]
    supported = refused = 0
    for family in TESTED:
        layout = layout_of(family_config(family))
        reasons: dict[str, list[str]] = {}
        for name in methods:
            reason = refusal(layout, BUILTINS[name].capabilities)
            if reason is None:
                supported += 1
            else:
                refused += 1
                reasons.setdefault(reason, []).append(name)
        kinds = ", ".join(f"{sum(layer.kind == kind for layer in layout.layers)} {kind}" for kind in layout.kinds())
        queries = "from the attention call" if layout.needs_capture else "recomputed from q_proj"
        cell = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in reasons.items()) or "none"
        lines.append(f"| {family} | {kinds} | {queries} | {FAMILIES[family].note or '-'} | {cell} |")
    lines.append("")
    lines.append(f"{len(TESTED)} families x {len(methods)} built-in methods: {supported} supported, {refused} refused.")
    lines += ["", _compressed_sliding(methods)]
    return "\n".join(lines)


def _compressed_sliding(methods: list[str]) -> str:
    """The methods that families with sliding layers also refuse under --kvbench-sliding compress."""
    sliding = [family for family in TESTED if SLIDING in layout_of(family_config(family)).kinds()]
    reasons: dict[str, list[str]] = {}
    for name in methods:
        for family in sliding:
            layout = layout_of(family_config(family))
            reason = refusal(layout, BUILTINS[name].capabilities, COMPRESS)
            if reason is not None and refusal(layout, BUILTINS[name].capabilities) is None:
                reasons.setdefault(reason, []).append(name)
                break
    cell = "; ".join(f"{', '.join(names)}: {reason}" for reason, names in reasons.items()) or "none"
    return f"With `--kvbench-sliding compress`, the families with sliding layers ({', '.join(sliding)}) also refuse {cell}."


def rewritten(text: str) -> str:
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{table()}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/models.md's table is out of date")
    args = parser.parse_args(argv)
    text = DOC.read_text(encoding="utf-8")
    if START not in text or END not in text:
        print(f"{DOC}: the family-table markers are missing", file=sys.stderr)
        return 1
    new = rewritten(text)
    if args.check:
        if new != text:
            print(f"{DOC}: the family table is out of date; run python scripts/write_family_table.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
