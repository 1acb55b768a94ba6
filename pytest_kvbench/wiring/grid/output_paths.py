"""Every path a pytest run will write, checked at configure: a usage error before any model loads.

The results directory itself is checked where it is resolved (options.results_dir); a run also
writes ``runs/<run_id>/`` below it, the shared ``RESULTS.md`` beside it and, when resumed, the
run's own files. A ``runs`` that is a file, or a ``RESULTS.md`` that is a directory, used to be
found when the first record was appended (an INTERNALERROR) or after the last item had run (a
traceback, the table not written). The ``--kvbench-save`` target is checked by the gate
(comparison/baseline_file.check_save_target).
"""

from __future__ import annotations

from pathlib import Path

from pytest_kvbench import user_paths
from pytest_kvbench.results.run import storage
from pytest_kvbench.results.run.directories import runs_dir
from pytest_kvbench.cases import GridError

def check_run_outputs(results: Path, run_id: str) -> None:
    """``runs/`` and the run's directory can be made or written, and each file the run will write
    (records, settings, run.json, RESULTS.md of the run and of the results directory) can be made or
    replaced; GridError (one line naming the path) otherwise."""
    run_dir = runs_dir(results) / run_id
    try:
        user_paths.writable_dir(runs_dir(results), "results directory")
        user_paths.writable_dir(run_dir, "run directory")
        user_paths.appendable_file(run_dir / storage.RECORDS_FILE, "run file")
        for name in (storage.SETTINGS_FILE, storage.RUN_FILE, storage.RESULTS_FILE):
            user_paths.writable_file(run_dir / name, "run file")
        user_paths.writable_file(results / storage.RESULTS_FILE, "results table")
    except user_paths.PathError as exc:
        raise GridError(str(exc)) from None
