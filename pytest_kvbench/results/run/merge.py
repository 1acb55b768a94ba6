"""``kvbench merge``: combine runs made on several machines into one new run.

Merging never touches its inputs and publishes the merged run with a single directory rename, so
a failed merge leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from pytest_kvbench.results.run import writer as run_writer
from pytest_kvbench.results.run import storage
from pytest_kvbench.results.record import Record
from pytest_kvbench.results.record.names import RecordNameError, check_record_names
from pytest_kvbench.results.run.directories import Run, RunError, load_run, runs_dir
from pytest_kvbench.results.run.state import run_expected, unfinished_of

# Grid settings that change what an item measures without appearing in its key: runs that
# disagree on them cannot become one run.
MERGE_MUST_AGREE = ("protocol", "dtype", "attn_implementation", "samples", "max_prompt_tokens", "data_dir",
                     "preset")  # shards of one preset run merge into a run of that preset
_MERGE_UNION = ("models", "methods", "budgets", "tasks", "context_lengths", "seeds")
_MERGE_UNION_WHEN_SET = ("storage_budgets",)  # lists a grid records only when set (cases.Grid.as_dict)

@dataclass
class _MergePlan:
    runs: list[Run]
    records: list[Record] = field(default_factory=list)
    grid: dict = field(default_factory=dict)


def _merged_grid(runs: list[Run]) -> dict:
    owned = [(r, r.info.get("grid")) for r in runs if isinstance(r.info.get("grid"), dict)]
    grids = [grid for _, grid in owned]
    merged: dict = {}
    for name in MERGE_MUST_AGREE:
        values = {json.dumps(g.get(name), sort_keys=True) for g in grids}
        if len(values) > 1:
            shown = ", ".join(f"{r.run_id}: {(r.info.get('grid') or {}).get(name)!r}" for r in runs)
            raise RunError(f"cannot merge runs with different {name} ({shown})")
        if grids:
            merged[name] = grids[0].get(name)
    for name in _MERGE_UNION + _MERGE_UNION_WHEN_SET:
        union: list = []
        for run, grid in owned:
            listed = grid.get(name) or []
            if not isinstance(listed, list):
                raise RunError(f"run {run.run_id}: run.json's grid field {name!r} is {listed!r}, not a list")
            for value in listed:
                if value not in union:
                    union.append(value)
        if union or name in _MERGE_UNION:
            merged[name] = union
    return merged


def _plan_merge(runs: list[Run]) -> _MergePlan:
    seen_paths: dict[Path, str] = {}
    for run in runs:
        resolved = run.path.resolve()
        if resolved in seen_paths:
            raise RunError(f"run {run.run_id} is given twice")
        seen_paths[resolved] = run.run_id
    owner: dict[str, str] = {}
    plan = _MergePlan(runs=runs, grid=_merged_grid(runs))
    for run in runs:
        for record in run.records:
            try:
                check_record_names(record, f"run {run.run_id}")
            except RecordNameError as exc:
                raise RunError(str(exc)) from None
            key = record.key
            if key in owner:
                raise RunError(f"cannot merge: item {key} is in both {owner[key]} and {run.run_id}")
            owner[key] = run.run_id
            plan.records.append(record)
    if not plan.records:
        raise RunError("nothing to merge: the runs hold no records")
    return plan


def _merged_state(plan: _MergePlan, records: list[Record]) -> dict:
    """What the merged run had to finish (every input's items) and did not, computed as every reader does."""
    expected, seen = [], set()
    for run in plan.runs:
        for item in run_expected(run.info, run.records):
            if item.get("key") not in seen:
                seen.add(item.get("key"))
                expected.append(item)
    crashed = [c for run in plan.runs for c in run.state.crashed]
    return {"expected": expected, "unfinished": unfinished_of(expected, records), "crashed": crashed}


def _merged_run_json(run_id: str, plan: _MergePlan, records: list[Record]) -> dict:
    starts = [r.info.get("start_ts") for r in plan.runs if isinstance(r.info.get("start_ts"), (int, float))]
    ends = [r.info.get("end") for r in plan.runs if isinstance(r.info.get("end"), str)]
    first_start = min(plan.runs, key=lambda r: r.info.get("start_ts") or float("inf"))
    state = _merged_state(plan, records)
    return run_writer.run_document(
        run_id=run_id, start=first_start.info.get("start"), start_ts=min(starts) if starts else None,
        end=max(ends) if ends else run_writer.iso_time(time.time()),  # a merged run has ended, as a merge
        # machine time spent on the merged results, not wall time (the runs may not overlap)
        duration_s=round(sum(float(r.info.get("duration_s") or 0) for r in plan.runs), 3),
        complete=all(r.complete for r in plan.runs) and not state["unfinished"], resumed=False, grid=plan.grid,
        environment=plan.runs[0].environment, records=records, **state,
        merged_from=[
            {"run_id": r.run_id, "path": str(r.path), "start": r.info.get("start"),
             "duration_s": r.info.get("duration_s"), "complete": r.complete,
             "records": len(r.records), "environment": r.environment}
            for r in plan.runs
        ])


def merge_runs(paths: Iterable[str | os.PathLike], out_results_dir: str | os.PathLike = "results",
               *, results_dir: str | os.PathLike | None = None) -> str:
    """Combine runs made on several machines into one new run under ``out_results_dir``.

    ``paths`` are run directories or ids (looked up in ``results_dir``, default the output
    directory). Refused with a RunError, before anything is written, when an item appears in two
    runs, the runs differ in a setting that is not part of the item key (protocol, dtype, ...) or one
    of them is damaged (run/state.py).
    Records keep their content; ``run_id`` becomes the merged id and ``merged_from_run`` names
    the run each came from. Returns the new run id.
    """
    lookup = results_dir if results_dir is not None else out_results_dir
    runs = [load_run(p, lookup) for p in paths]
    if len(runs) < 2:
        raise RunError("merge needs at least two runs")
    damaged = next((run for run in runs if run.state.damaged), None)
    if damaged is not None:  # a merged run would look whole: its sources' damage must be seen first
        raise RunError(f"run {damaged.run_id} is {damaged.state.label()}; merge takes intact runs only "
                       f"(see what it holds with `kvbench show {damaged.run_id}`)")
    plan = _plan_merge(runs)
    run_id = storage.new_run_id()
    records = []
    for run in runs:
        for record in run.records:
            records.append(replace(record, run_id=run_id, merged_from_run=run.run_id))
    run = _merged_run_json(run_id, plan, records)

    parent = runs_dir(out_results_dir)
    staging = parent / f".{run_id}.merging"  # hidden from list_runs until the final rename
    try:
        parent.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
    except OSError as exc:
        raise RunError(f"cannot create the merged run under {parent}: {exc.strerror or exc}") from None
    try:
        storage.write_jsonl(staging / storage.RECORDS_FILE, [r.to_json() for r in records])
        run_writer.write_run(staging, run, records)
        os.rename(staging, parent / run_id)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise RunError(f"cannot write the merged run under {parent}: {exc.strerror or exc}") from None
    except run_writer.ItemPathError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise RunError(f"cannot merge: {exc}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return run_id
