"""`kvbench export --format kvpress | kvcache-factory`: the chosen layout built from a run's records and written.

The two layouts share their writing (exports/directory.py) and depend on it; this module picks one, so the
shared part never imports the layouts that build on it.
"""

from __future__ import annotations

from collections import Counter

from pytest_kvbench.results.exports.directory import write_export
from pytest_kvbench.results.views.table_formats import ExportError
from pytest_kvbench.results.exports.kvcache_factory_layout import kvcache_factory_export
from pytest_kvbench.results.exports.kvpress_layout import kvpress_export
from pytest_kvbench.results.record import Record


def export_directory(records: list[Record], run_id: str | None, fmt: str, output: str | None) -> list[str]:
    """Build and write the ``fmt`` layout under ``output``; the lines that tell what was written and left out."""
    if not output:
        raise ExportError(f"--format {fmt} writes a directory of files: give --output DIR")
    build = kvpress_export if fmt == "kvpress" else kvcache_factory_export
    export = build(records, run_id)
    written = write_export(export, output, fmt)
    lines = [f"wrote {len(written)} files under {output} in {fmt}'s layout"]
    if export.left_out:
        reasons = Counter(export.left_out.values())
        lines.append("left out: " + "; ".join(f"{n} record(s): {why}" for why, n in sorted(reasons.items())))
    return lines
