"""Whether a gated run compared every entry of its baseline: `kvbench coverage RUN BASELINE`, a CI step.

The gate (`--kvbench-compare`) reports items without a baseline entry as new and lists entries that did not
run, without failing: right for a growing grid, but a CI gate whose model label or task changed would then
pass while comparing nothing. CI calls `kvbench coverage` after the gated run (.ci/real-model.sh): exit 1
unless every baseline entry was judged.
"""

from __future__ import annotations


def uncompared(records: list, baseline_keys: set[str]) -> list[str]:
    """Baseline keys that no record of the run was judged against (judged: a verdict other than new)."""
    judged = {r.key for r in records if (r.verdict or {}).get("status") not in (None, "new")}
    return sorted(baseline_keys - judged)


def coverage_message(missing: list[str], baseline_keys: set[str]) -> str:
    """One line: how many entries went uncompared and which, or that all were compared."""
    if missing:
        return (f"{len(missing)} of {len(baseline_keys)} baseline entries were not compared (renamed model or task?): "
                + ", ".join(missing))
    return f"all {len(baseline_keys)} baseline entries compared"
