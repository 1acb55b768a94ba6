"""One benchmark run: its id and directory, the records it produced, and what it writes at the end.

Workers append each finished item's record to ``records.jsonl`` (results/storage.py) the moment it
finishes; the controller alone, at session end, reads them all back and writes ``run.json``, the
per-task prediction files and RESULTS.md. A crash therefore loses at most the running item, and
``--kvbench-resume RUN_ID`` can complete the same directory later.
"""

from __future__ import annotations

import time
from pathlib import Path

from pytest_kvbench.results import run_writer, storage
from pytest_kvbench.results.record import is_finished
from pytest_kvbench.wiring.grid import Grid


class RunSession:
    def __init__(self, grid: Grid, results_dir: Path, run_id: str, *, is_controller: bool,
                 environment: dict, resumed: bool = False) -> None:
        self.grid = grid
        self.results_dir = results_dir
        self.run_id = run_id
        self.run_dir = results_dir / "runs" / run_id
        self.records_path = self.run_dir / storage.RECORDS_FILE
        self.is_controller = is_controller
        self.environment = environment
        self.resumed = resumed
        self.start = time.time()
        self.final_records: list[dict] | None = None  # what finish() wrote, for the terminal summary

    # -- records -----------------------------------------------------------------------------
    def add(self, record: dict) -> None:
        """Persist one finished record now (crash safety)."""
        storage.append_record(self.records_path, record)

    def all_records(self) -> list[dict]:
        """Every record of the run (all workers, earlier resumed attempts), the last per case."""
        return storage.latest_per_key(storage.read_records(self.records_path))

    def finished_keys(self) -> set[str]:
        return {r["key"] for r in self.all_records() if is_finished(r)}

    # -- end of run ----------------------------------------------------------------------------
    def finish(self, *, complete: bool) -> dict:
        """Write run.json, per-task files and RESULTS.md from every record; return run.json."""
        records = self.final_records = self.all_records()
        previous = self._previous_run()
        start = previous.get("start_ts", self.start) if previous else self.start
        end = time.time()
        run = run_writer.run_document(
            run_id=self.run_id, start=run_writer.iso_time(start), start_ts=start, end=run_writer.iso_time(end),
            duration_s=round(end - start, 3), complete=complete, resumed=self.resumed or bool(previous),
            grid=self.grid.as_dict(), environment=self.environment, records=records)
        markdown = run_writer.write_run(self.run_dir, run)
        storage.atomic_write_text(self.results_dir / run_writer.RESULTS_FILE, markdown)
        return run

    def _previous_run(self) -> dict | None:
        path = self.run_dir / storage.RUN_FILE
        if not path.exists():
            return None
        import json

        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
