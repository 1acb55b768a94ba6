"""One benchmark run: its id and directory, the records it produced, and what it writes at the end.

Workers append each finished item's record to ``records.jsonl`` (results/run/storage.py) the moment it
finishes; the controller alone, at session end, reads them all back and writes ``run.json``, the
per-task prediction files and RESULTS.md. A crash therefore loses at most the running item, and
``--kvbench-resume RUN_ID`` can complete the same directory later.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

from pytest_kvbench import atomic_files
from pytest_kvbench.cases import Grid
from pytest_kvbench.results.run import storage
from pytest_kvbench.results.run.environment import capture_environment, installed_packages
from pytest_kvbench.results.record import Record, superseded
from pytest_kvbench.results.run.directories import parse_records


class RunSession:
    def __init__(self, grid: Grid, results_dir: Path, run_id: str, *, is_controller: bool,
                 environment: dict | None = None, invocation_args: Sequence[str] = (), resumed: bool = False) -> None:
        self.grid = grid
        self.results_dir = results_dir
        self.run_id = run_id
        self.run_dir = results_dir / "runs" / run_id
        self.records_path = self.run_dir / storage.RECORDS_FILE
        self.is_controller = is_controller
        self._environment = environment
        self._invocation_args = list(invocation_args)
        self.resumed = resumed
        self.start = time.time()
        self.final_records: list[Record] | None = None  # what finish() wrote, for the terminal summary
        self.expected: dict[str, tuple[str, str]] = {}  # key -> (item id, node id) of the selected items
        self.unfinished: list[dict] = []  # what finish() found missing
        self.written: list[str] = []  # what finish() wrote (wiring/final_writes.py) ...
        self.write_failures: list = []  # ... and what it could not, with the path and why
        self.cases_by_id: dict | None = None  # filled by the plugin on first use
        self.lock = None  # the run directory's RunLock while this controller holds it (results/run/lock.py)
        # a resumed run: the records of its earlier attempts, by key, read once before any item runs here
        self._earlier = {r.key: r for r in self.all_records()} if resumed else {}

    @property
    def environment(self) -> dict:
        return self.capture_environment()

    def capture_environment(self) -> dict:
        """Git commit, package versions, command line (results/run/environment.py), captured once: when the
        controller's collection found items (run_plugin.py), or when first read; not at configure, which runs
        in every pytest run of a user (git is a subprocess)."""
        if self._environment is None:
            self._environment = capture_environment(self._invocation_args)
        return self._environment

    # -- the run directory's lock ----------------------------------------------------------------
    def hold_lock(self) -> None:
        """Controller: lock the run directory before any item runs (RunInUse when another process has it)."""
        if self.lock is None:
            from pytest_kvbench.results.run.lock import RunLock  # lazy: filelock, for runs only

            self.lock = RunLock(self.run_dir).acquire()

    def release_lock(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # -- what this run must finish -------------------------------------------------------------
    def expect(self, cases_and_nodeids) -> None:
        """The controller learns the selected items (its own collection, or each xdist worker's)."""
        for case, nodeid in cases_and_nodeids:
            self.expected.setdefault(case.key, (case.id, nodeid))

    def resume_command(self) -> str:
        command = str(self.environment.get("command") or "pytest bench/")
        return command if "--kvbench-resume" in command else f"{command} --kvbench-resume {self.run_id}"

    def unfinished_items(self, records: list[Record]) -> list[dict]:
        """Selected items with no record, or whose worker crashed: each with why and how to finish it."""
        by_key = {r.key: r for r in records}
        out = []
        for key, (item_id, nodeid) in self.expected.items():
            record = by_key.get(key)
            if record is not None and not record.crashed:
                continue
            reason = record.message if record is not None else "no record: the run stopped before it finished"
            out.append({"item_id": item_id, "nodeid": nodeid, "key": key, "reason": reason})
        return out

    # -- records -----------------------------------------------------------------------------
    def add(self, record: Record | dict) -> str | None:
        """Persist one finished record now (crash safety), and the run's settings with the first one.
        ``record``: typed, or as the ``pytest_kvbench_record`` hook passes it (its JSON form).

        In a resumed run, an item re-run after an earlier attempt (a crash, an error) says which record it
        supersedes; readers take the newest record per key (storage.latest_per_key), so the old line stays
        in records.jsonl as history and counts nowhere.

        A write the OS refuses (a full disk, the directory taken away) returns one line saying so: the
        plugin stops the session with it (pytest's own "Interrupted: ..." line, no traceback), since every
        later record would be lost the same way; the records before it are kept."""
        raw = record.to_json() if isinstance(record, Record) else record
        earlier = self._earlier.get(raw.get("key"))
        if earlier is not None:
            raw = raw | {"supersedes": superseded(earlier)}
        try:
            self._write_settings()
            storage.append_record(self.records_path, raw)
        except OSError as exc:
            return (f"kvbench: the record of {raw.get('item_id') or raw.get('key')} could not be written to "
                    f"{self.records_path} ({(exc.strerror or str(exc)).lower()}); the records before it are kept")
        return None

    def _write_settings(self) -> None:
        """settings.json, once: what --kvbench-resume checks a later attempt against."""
        settings = self.run_dir / storage.SETTINGS_FILE
        if not settings.exists():
            atomic_files.atomic_write_json(settings, self.grid.as_dict())

    def all_records(self) -> list[Record]:
        """Every record of the run (all workers, earlier resumed attempts), the last per case; a line that is
        not a record is skipped here (``kvbench show`` names it: results/run/state.py)."""
        records = parse_records(storage.scan_records(self.records_path).records, str(self.records_path))
        return storage.latest_per_key(records)

    def finished_keys(self) -> set[str]:
        return {r.key for r in self.all_records() if r.is_finished}

    # -- end of run ----------------------------------------------------------------------------
    def finish(self, *, complete: bool) -> dict:
        """Write run.json, per-task files and RESULTS.md from every record, each on its own (a failure is
        kept in ``write_failures``, the others are still written); return run.json's content."""
        from pytest_kvbench.results.run import writer as run_writer  # lazy for startup time: tables and tabulate, at the end only
        from pytest_kvbench.wiring.final_writes import write_each

        records = self.final_records = self.all_records()
        self.unfinished = self.unfinished_items(records)
        complete = complete and not self.unfinished
        previous = self._previous_run()
        start = previous.get("start_ts", self.start) if previous else self.start
        end = time.time()
        run = run_writer.run_document(
            run_id=self.run_id, start=run_writer.iso_time(start), start_ts=start, end=run_writer.iso_time(end),
            duration_s=round(end - start, 3), complete=complete, resumed=self.resumed or bool(previous),
            grid=self.grid.as_dict(), records=records,
            environment=self.environment | {"packages": installed_packages()},  # read once, at the end
            unfinished=self.unfinished, resume_command=None if complete else self.resume_command())
        files, markdown = run_writer.run_files(self.run_dir, run, records)
        # settings.json too: a run stopped before its first record can be resumed
        files.insert(0, (storage.SETTINGS_FILE, self.run_dir / storage.SETTINGS_FILE, self._write_settings))
        table = self.results_dir / storage.RESULTS_FILE
        files.append((f"{storage.RESULTS_FILE} of the results directory", table,
                      lambda: atomic_files.atomic_write_text(table, markdown)))
        self.written, self.write_failures = write_each(files)
        return run

    def kept(self) -> list[str]:
        """What a failure line says was kept: the records, and what finish() did write."""
        count = len(self.final_records or [])
        kept = [f"{self.records_path} ({count} record{'s' if count != 1 else ''})"]
        return kept + [what for what in dict.fromkeys(self.written) if what not in ("item folder", storage.SETTINGS_FILE)]

    def _previous_run(self) -> dict | None:
        path = self.run_dir / storage.RUN_FILE
        if not path.exists():
            return None

        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
