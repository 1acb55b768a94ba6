"""The regression gate inside pytest: --kvbench-save, --kvbench-compare and --kvbench-compare-fail.

The statistics and the baseline file format live in comparison/ (shared with ``kvbench
compare``); this module only connects them to a pytest run: the baseline is read and checked
at configure time (bad file -> usage error before any model loads), each item checks itself
against its entry, and the controller writes a new baseline and the comparison table at the end.
"""

from __future__ import annotations

import pytest

from pytest_kvbench.cases import GridError
from pytest_kvbench.comparison.baseline_file import BaselineError, check_save_target, load_baseline, write_baseline
from pytest_kvbench.comparison.tolerances import parse_tolerances
from pytest_kvbench.results.record import Record
from pytest_kvbench.wiring.final_writes import WriteFailure


class Gate:
    def __init__(self, baseline=None, tolerances=None, save_path: str | None = None, save_force: bool = False) -> None:
        self.baseline = baseline
        self.tolerances = tolerances
        self.save_path = save_path
        self.save_force = save_force
        self._verdicts: list = []
        self._unrun: list[str] = []
        self._saved: str | None = None
        self.write_failures: list = []  # the baseline not saved (wiring/final_writes.py)

    @classmethod
    def from_config(cls, config: pytest.Config) -> "Gate":
        compare = config.getoption("kvbench_compare")
        save = config.getoption("kvbench_save")
        force = config.getoption("kvbench_save_force")
        if not (compare or save or config.getoption("kvbench_compare_fail")):
            return cls()  # no gate: keep scipy (statistics) out of plain runs and collection

        try:
            tolerances = parse_tolerances(config.getoption("kvbench_compare_fail") or [])
            if config.getoption("kvbench_compare_fail") and not compare:  # a tolerance judges against a baseline
                raise BaselineError(f"--kvbench-compare-fail {','.join(config.getoption('kvbench_compare_fail'))} "
                                    f"has no effect without --kvbench-compare BASELINE; add one, or leave it out")
            baseline = load_baseline(compare) if compare else None
            if save:
                check_save_target(save, force)
        except BaselineError as exc:
            raise GridError(str(exc)) from None
        return cls(baseline, tolerances, save, force)

    def judge(self, record: Record):
        """The item's Verdict against its baseline entry; None without --kvbench-compare."""
        if self.baseline is None:
            return None
        # lazy for startup time: verdicts import numpy and scipy, only with --kvbench-compare
        from pytest_kvbench.comparison.verdicts import compare_record

        return compare_record(record, self.baseline.entry(record), self.tolerances)

    def finish(self, records: list[Record], environment: dict) -> None:
        """Controller, end of run: comparison over all records and the optional new baseline."""
        if self.baseline is None and not self.save_path:
            return
        # lazy for startup time: verdicts import numpy and scipy (see above)
        from pytest_kvbench.comparison.verdicts import Verdict

        finished = [r for r in records if r.is_finished and r.samples]
        if self.baseline is not None:
            # each item attached its verdict when it ran (KvbenchFixture.check); an item whose test
            # never asked is judged now
            self._verdicts = [Verdict.from_dict(r.verdict) if r.verdict else self.judge(r) for r in finished]
            self._unrun = self.baseline.unrun({r.key for r in records})
        if self.save_path:

            try:
                write_baseline(self.save_path, finished, environment, force=self.save_force)
            except BaselineError as exc:  # unwritable since configure, replaced meanwhile, or no score to save
                self.write_failures = [WriteFailure("baseline", str(exc))]
            else:
                self._saved = self.save_path

    def summary_lines(self) -> list[str]:
        lines = []
        if self._verdicts:
            # lazy for startup time: numpy and scipy (see above)
            from pytest_kvbench.comparison.power import power_lines
            from pytest_kvbench.comparison.verdict_format import comparison_table, score_alone_note

            lines += ["comparison with baseline:", comparison_table(self._verdicts)]
            from pytest_kvbench.comparison.benchmark_changes import without_fingerprint_note  # lazy: as above

            lines += [note for note in (score_alone_note(self.baseline, self.tolerances),
                                        without_fingerprint_note(self.baseline)) if note]
            lines += power_lines(self.baseline.entries.values(), self.tolerances)
        if self._unrun:
            lines.append(f"baseline entries not run ({len(self._unrun)}): {', '.join(self._unrun[:20])}"
                         + (" ..." if len(self._unrun) > 20 else ""))
        if self._saved:
            lines.append(f"baseline written: {self._saved}")
        return lines
