"""What the ``kvbench`` verbs share: exit codes, number formatting, loading a run, writing an output file.

Exit codes are a contract (cli.py): 0 success, 1 a regression or an uncompared baseline entry, 2 bad input or a
damaged run.
"""

from __future__ import annotations

import math
import sys

from pytest_kvbench import atomic_files
from pytest_kvbench.cli_checks import UsageError
from pytest_kvbench.results.run.directories import Run, load_run

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE = 0, 1, 2
MiB = 2**20


def fmt(value, digits: int = 2, scale: float = 1.0) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        return "-"
    return f"{value / scale:.{digits}f}"


def load(args, spec: str) -> Run:
    """A run for a read command; a damaged one is remembered: main() names it and exits 2 at the end."""
    run = load_run(spec, args.results)
    if run.state.damaged and all(r.path != run.path for r in args.damaged):
        args.damaged.append(run)
    return run


def write_output(path: str, text: str, what: str) -> None:
    try:
        atomic_files.atomic_write_text(path, text, make_parents=False)  # its folder was checked to exist
    except OSError as exc:
        raise UsageError(f"cannot write {what} {path}: {exc.strerror or exc}") from None
    print(f"wrote {path}", file=sys.stderr)
