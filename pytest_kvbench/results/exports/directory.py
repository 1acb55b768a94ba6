"""What the directory exports share (``kvbench export --format kvpress | kvcache-factory``): a set of files
under one output directory, written only when none of them would replace a file already there.

These exports lay a run out as another project's evaluation writes it, so its own readers (and people
used to its folders) take our rows next to theirs. Records outside that evaluation (another suite,
budget kind or cache protocol) are left out and counted, never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pytest_kvbench import atomic_files, user_paths
from pytest_kvbench.results.views.table_formats import ExportError


DIRECTORY_FORMATS = ("kvpress", "kvcache-factory")


@dataclass
class DirectoryExport:
    files: dict[str, str] = field(default_factory=dict)  # path relative to the output directory -> text
    left_out: dict[str, str] = field(default_factory=dict)  # record key -> why it is not in the export

    def add(self, relative: str, text: str) -> None:
        if relative in self.files:
            raise ExportError(f"two groups of records would write {relative}; export them from separate runs")
        self.files[relative] = text


def write_export(export: DirectoryExport, output: str, what: str) -> list[Path]:
    """Write every file under ``output``; ExportError (nothing written) when there is nothing to write or a
    file exists already: results written before are never replaced."""
    if not export.files:
        reasons = sorted(set(export.left_out.values()))
        why = "; ".join(reasons) or "the run has no records"
        raise ExportError(f"nothing to export in the {what} layout: {why}")
    try:
        root = user_paths.writable_dir(output, "--output", make_parents=False)
    except user_paths.PathError as exc:
        raise ExportError(str(exc)) from None
    targets = [root / relative for relative in export.files]
    existing = [path for path in targets if path.exists()]
    if existing:
        raise ExportError(f"{user_paths.shown(existing[0])} exists already ({len(existing)} of the export's "
                          f"{len(targets)} files do); choose another --output directory")
    for path, text in zip(targets, export.files.values()):
        atomic_files.atomic_write_text(path, text)
    return targets
