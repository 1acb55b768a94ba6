"""The ``kvbench`` section of pytest's terminal summary: the controller's tables and verdicts.

What a user reads first after a run: one table per budget kind (the same table model as
RESULTS.md), items that scored exactly 0, the gate's verdicts, whether the run is incomplete and
how to finish it, and where the run directory and RESULTS.md are.
"""

from __future__ import annotations

from pathlib import Path
from pytest_kvbench.wiring.final_writes import failure_line


def write_summary(terminalreporter, run, gate) -> None:
    # lazy for startup time: tables import tabulate and the task summaries; only at the end of a benchmark run
    from pytest_kvbench.results.views.tables import budget_tables, zero_scores

    records = run.final_records if run.final_records is not None else run.all_records()
    terminalreporter.section("kvbench")
    for heading, table in budget_tables(records, fmt="simple", bold=False):
        terminalreporter.write_line(heading)
        terminalreporter.write_line(table)
        terminalreporter.write_line("")
    zeros = zero_scores(records)
    if zeros:
        shown = ", ".join(zeros[:8]) + (", ... (list in RESULTS.md)" if len(zeros) > 8 else "")
        terminalreporter.write_line(f"{len(zeros)} item(s) scored exactly 0 (check these): {shown}", yellow=True)
    shrunk = sorted({r.latency.decode_batch_note for r in records if r.latency.decode_batch_note})
    if shrunk:  # once, whatever number of items (and workers) saw it
        terminalreporter.write_line(f"{shrunk[0]} (no sample lost; --kvbench-decode-batch sets the limit)", yellow=True)
    for line in gate.summary_lines():
        terminalreporter.write_line(line)
    if run.unfinished:
        shown = ", ".join(u["item_id"] for u in run.unfinished[:8]) + (" ..." if len(run.unfinished) > 8 else "")
        terminalreporter.write_line(f"run {run.run_id} is incomplete: {len(run.unfinished)} item(s) not finished "
                                    f"({shown}); finish them with: {run.resume_command()}", red=True)
    if run.crashed:  # complete, but not without trouble: the item's worker died once
        shown = ", ".join(f"{c['item_id']}: re-run" for c in run.crashed[:8]) + (" ..." if len(run.crashed) > 8 else "")
        terminalreporter.write_line(f"run {run.run_id}: {len(run.crashed)} crashed item(s) ({shown})", yellow=True)
    terminalreporter.write_line(f"run {run.run_id}: {run.run_dir} ; table: {Path(run.results_dir) / 'RESULTS.md'}")
    failures = run.write_failures + gate.write_failures
    if failures:

        terminalreporter.write_line(failure_line(failures, run.kept()), red=True)
