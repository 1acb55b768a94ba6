"""One benchmark run: its id and directory, the records it produced, and what it writes at the end.

Workers append each finished item's record to ``records.jsonl`` (results/run/storage.py) the moment it
finishes; the controller alone, at session end, reads them all back and writes ``run.json``, the
per-task prediction files and RESULTS.md. A crash therefore loses at most the running item, and
``--kvbench-resume RUN_ID`` can complete the same directory later. When the run starts (its items
known, its directory locked) the controller writes a first run.json: the selected items, the settings
and the provenance (commit, command, versions), so a run killed with -9 still says what it was and
which items it did not finish (results/run/state.py reads both forms the same way).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from pytest_kvbench.cases import Grid
from pytest_kvbench.results.run import storage
from pytest_kvbench.results.run.environment import capture_environment, installed_packages, with_fields
from pytest_kvbench.results.record import Record
from pytest_kvbench.results.run.directories import parse_records
from pytest_kvbench.results.run.state import crashed_then_run, expected_items, unfinished_of


_UNREAD = object()


class RunSession:
    def __init__(self, grid: Grid, results_dir: Path, run_id: str, *, is_controller: bool,
                 environment: dict | None = None, invocation_args: Sequence[str] = (), resumed: bool = False,
                 environment_fields: Callable[[dict], list] | None = None, results_columns: dict | None = None,
                 ) -> None:
        self.grid = grid
        self.results_dir = results_dir
        self.run_id = run_id
        self.run_dir = results_dir / "runs" / run_id
        self.records_path = self.run_dir / storage.RECORDS_FILE
        self.is_controller = is_controller
        self._environment = environment
        self._invocation_args = list(invocation_args)
        self._environment_fields = environment_fields  # the pytest_kvbench_environment hooks' answers
        self.results_columns = results_columns or {}  # RESULTS.md's columns of a user's own (header -> function)
        self.resumed = resumed
        self.start = time.time()
        self.final_records: list[Record] | None = None  # what finish() wrote, for the terminal summary
        self.expected: dict[str, tuple[str, str]] = {}  # key -> (item id, node id) of the selected items
        self.unfinished: list[dict] = []  # what finish() found missing ...
        self.crashed: list[dict] = []  # ... and what crashed, then ran again
        self.written: list[str] = []  # what finish() wrote (wiring/final_writes.py) ...
        self.write_failures: list = []  # ... and what it could not, with the path and why
        self.lock = None  # the run directory's RunLock while this controller holds it (results/run/lock.py)
        self._tail = storage.RecordsTail(self.records_path)  # the newest record per key, for ``supersedes``
        self._started_with = 0  # how many expected items the run.json written at the start names
        self._earlier_run: object = _UNREAD  # an earlier attempt's run.json (_previous_run)

    @property
    def environment(self) -> dict:
        return self.capture_environment()

    def capture_environment(self) -> dict:
        """Git commit, package versions, command line (results/run/environment.py) and the fields the
        pytest_kvbench_environment hooks add, captured once: when the
        controller's collection found items (run_plugin.py), or when first read; not at configure, which runs
        in every pytest run of a user (git is a subprocess)."""
        if self._environment is None:
            captured = capture_environment(self._invocation_args)
            added = self._environment_fields(dict(captured)) if self._environment_fields else []
            self._environment = with_fields(captured, added)
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
    def expect(self, cases_and_ids) -> None:
        """The controller learns the selected items (its own collection, or each xdist worker's): (case, item id,
        node id) each."""
        for case, item_id, nodeid in cases_and_ids:
            self.expected.setdefault(case.key, (item_id, nodeid))

    def expected_items(self, previous: dict | None) -> list[dict]:
        """Every item the run must finish: an earlier attempt's (a resumed run) and this session's."""
        items = list(expected_items(previous or {}) or [])
        known = {item.get("key") for item in items}
        items += [{"item_id": item_id, "nodeid": nodeid, "key": key}
                  for key, (item_id, nodeid) in self.expected.items() if key not in known]
        return items

    def write_start(self) -> None:
        """Controller, once the selected items are known and the directory locked: settings.json and a run.json
        that says the run started (no ``end``), with its items and provenance; again when more items arrive (each
        xdist worker reports its collection). A failed write is left to the end of the run, which names it."""
        if len(self.expected) <= self._started_with:
            return
        from pytest_kvbench.results.run import writer  # lazy for startup time: tables and tabulate

        self._started_with = len(self.expected)
        previous = self._previous_run()
        records = self.all_records() if self.records_path.exists() else []
        expected = self.expected_items(previous)
        start = previous.get("start_ts", self.start) if previous else self.start
        run = writer.run_document(
            run_id=self.run_id, start=writer.iso_time(start), start_ts=start, end=None, duration_s=0.0,
            complete=False, resumed=self.resumed or bool(previous), grid=self.grid.as_dict(),
            environment=self.environment, records=records, expected=expected,
            unfinished=unfinished_of(expected, records), resume_command=self.resume_command())
        try:
            for _, _, write in writer.start_of_run_files(self.run_dir, run, self.grid.as_dict()):
                write()
        except OSError:
            pass

    def resume_command(self) -> str:
        command = str(self.environment.get("command") or "pytest bench/")
        return command if "--kvbench-resume" in command else f"{command} --kvbench-resume {self.run_id}"

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

        def with_supersedes(raw: dict) -> dict:  # under the records file's lock: what it holds by now
            self._tail.update()
            earlier = self._tail.latest.get(raw.get("key"))
            return raw | {"supersedes": earlier} if earlier is not None else raw

        try:
            storage.write_settings(self.run_dir, self.grid.as_dict())
            storage.append_record(self.records_path, raw, with_supersedes)
        except OSError as exc:
            return (f"kvbench: the record of {raw.get('item_id') or raw.get('key')} could not be written to "
                    f"{self.records_path} ({(exc.strerror or str(exc)).lower()}); the records before it are kept")
        return None

    def history(self) -> list[Record]:
        """Every record line of the run, oldest first (crashed attempts included); a line that is not a record is
        skipped here (``kvbench show`` names it: results/run/state.py)."""
        return parse_records(storage.scan_records(self.records_path).records, str(self.records_path))

    def all_records(self) -> list[Record]:
        """Every record of the run (all workers, earlier resumed attempts), the last per case."""
        return storage.latest_per_key(self.history())

    def finished_keys(self) -> set[str]:
        return {r.key for r in self.all_records() if r.is_finished}

    # -- end of run ----------------------------------------------------------------------------
    def finish(self, *, complete: bool) -> dict:
        """Write what results/run/writer.py says ends the run (settings.json, item folders, run.json, both
        RESULTS.md copies), each on its own (a failure is kept in ``write_failures``, the others are still
        written); return run.json's content."""
        from pytest_kvbench.results.run import writer as run_writer  # lazy for startup time: tables and tabulate, at the end only
        from pytest_kvbench.wiring.final_writes import write_each

        history = self.history()
        records = self.final_records = storage.latest_per_key(history)
        previous = self._previous_run()
        expected = self.expected_items(previous)
        self.unfinished = unfinished_of(expected, records)  # the readers' own computation (results/run/state.py)
        self.crashed = crashed_then_run(history, records)
        complete = complete and not self.unfinished
        start = previous.get("start_ts", self.start) if previous else self.start
        end = time.time()
        run = run_writer.run_document(
            run_id=self.run_id, start=run_writer.iso_time(start), start_ts=start, end=run_writer.iso_time(end),
            duration_s=round(end - start, 3), complete=complete, resumed=self.resumed or bool(previous),
            grid=self.grid.as_dict(), records=records,
            environment=self.environment | {"packages": installed_packages()},  # read once, at the end
            expected=expected, unfinished=self.unfinished, crashed=self.crashed,
            resume_command=None if complete else self.resume_command())
        files = run_writer.end_of_run_files(self.run_dir, run, records, settings=self.grid.as_dict(),
                                            results_dir=self.results_dir, columns=self.results_columns)
        self.written, self.write_failures = write_each(files)
        return run

    def kept(self) -> list[str]:
        """What a failure line says was kept: the records, and what finish() did write."""
        count = len(self.final_records or [])
        kept = [f"{self.records_path} ({count} record{'s' if count != 1 else ''})"]
        return kept + [what for what in dict.fromkeys(self.written) if what not in ("item folder", storage.SETTINGS_FILE)]

    def _previous_run(self) -> dict | None:
        """The run.json of an earlier attempt (a resumed run), read once, before this session writes its own."""
        if self._earlier_run is _UNREAD:
            self._earlier_run = None
            try:
                found = json.loads((self.run_dir / storage.RUN_FILE).read_text(encoding="utf-8"))
                self._earlier_run = found if isinstance(found, dict) else None
            except (OSError, ValueError):
                pass
        return self._earlier_run
