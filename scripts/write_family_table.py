"""Write docs/models.md's family x capability table from the family descriptions (kvmethods/core/family_table.py).

Each row is a family of kvmethods/testing.py's tiny models described from its config alone (core/family_table.layout_of, the
same description the startup check uses, which tests/kvmethods/test_families.py checks against the probe of a
loaded model), and each capability a family may refuse is asked the one rule table (core/layout.refusal). The table
names capabilities, not methods, so adding a method leaves it as it is; `kvbench methods` names each method's
refusing families. The table sits
between two markers in docs/models.md; `python scripts/write_family_table.py` rewrites it there, `--check` exits 1
when it is out of date (tests/kvmethods/test_families.py runs the check).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kvmethods.core.capabilities import Capability
from kvmethods.core.layout import COMPRESS, KEEP, SLIDING, refusal
from kvmethods.core.family_table import FAMILIES, layout_of
from kvmethods.testing import FAMILIES as TESTED, family_config

ROOT = Path(__file__).resolve().parents[1]

DOC = ROOT / "docs" / "models.md"
START, END = "<!-- family-table: written by scripts/write_family_table.py -->", "<!-- family-table end -->"


# The capabilities a family may refuse, each asked alone (an evicting method with it; a storage), so that the table
# reads the same whatever methods exist: `kvbench methods` names the methods that declare each one
REFUSABLE = (Capability.OWN_STORAGE, Capability.HEAD_ADAPTIVE, Capability.SCORES_WHOLE_PROMPT,
             Capability.PRE_ROPE_QUERIES, Capability.PRE_ROPE_KEYS, Capability.MERGES_VALUES,
             Capability.RUNS_PREFILL, Capability.COMPRESSES_WHILE_DECODING, Capability.RECOMPRESSES_PER_TURN,
             Capability.KEEPS_LAYERS_WHOLE)


def _asked(flag: Capability) -> Capability:
    return flag if flag == Capability.OWN_STORAGE else Capability.COMPRESSES | flag


def _refused(layout, sliding: str = KEEP) -> dict[str, list[str]]:
    """reason -> the capabilities refused for it (a plain evicting method's own refusal under `everything`)."""
    reasons: dict[str, list[str]] = {}
    plain = refusal(layout, Capability.COMPRESSES, sliding)
    if plain is not None:
        return {plain: ["every method"]}
    for flag in REFUSABLE:
        reason = refusal(layout, _asked(flag), sliding)
        if reason is not None:
            reasons.setdefault(reason, []).append(f"`{flag.name}`")
    return reasons


def _cell(reasons: dict[str, list[str]]) -> str:
    return "; ".join(f"{', '.join(flags)}: {reason}" for reason, flags in reasons.items()) or "none"


def table() -> str:
    lines = ["| family | layers (tiny test model) | queries | what is special | refused capabilities (why) |",
             "| --- | --- | --- | --- | --- |"]
    for family in TESTED:
        layout = layout_of(family_config(family))
        kinds = ", ".join(f"{sum(layer.kind == kind for layer in layout.layers)} {kind}" for kind in layout.kinds())
        queries = "from the attention call" if layout.needs_capture else "recomputed from q_proj"
        lines.append(f"| {family} | {kinds} | {queries} | {FAMILIES[family].note or '-'} | {_cell(_refused(layout))} |")
    lines += ["", _compressed_sliding()]
    return "\n".join(lines)


def _compressed_sliding() -> str:
    """The capabilities that families with sliding layers also refuse under --kvbench-sliding compress."""
    sliding = [family for family in TESTED if SLIDING in layout_of(family_config(family)).kinds()]
    reasons: dict[str, list[str]] = {}
    for family in sliding:
        layout = layout_of(family_config(family))
        kept = _refused(layout)
        for reason, flags in _refused(layout, COMPRESS).items():
            for flag in flags:
                if not any(flag in others for others in kept.values()) and flag not in reasons.get(reason, []):
                    reasons.setdefault(reason, []).append(flag)
    return (f"With `--kvbench-sliding compress`, the families with sliding layers ({', '.join(sliding)}) also refuse "
            f"{_cell(reasons)}.")


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
