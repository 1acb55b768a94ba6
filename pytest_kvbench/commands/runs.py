"""The ``kvbench`` verbs that list and read runs: ``list``, ``tasks``, ``show``, ``env``, ``merge``."""

from __future__ import annotations

import json
import shlex
import sys
from collections import defaultdict
from pathlib import Path

from tabulate import tabulate

from pytest_kvbench.cli_checks import UsageError
from pytest_kvbench.commands.common import EXIT_OK, MiB, fmt, load
from pytest_kvbench.results.record import Record
from pytest_kvbench.results.run.directories import Run, RunError, list_runs, load_run
from pytest_kvbench.results.run.merge import merge_runs
from pytest_kvbench.results.run.reproduction import reproduction_text
from pytest_kvbench.results.views.table_formats import to_markdown
from pytest_kvbench.tasks import TaskError
from pytest_kvbench.tasks.registry import task_listing


def cmd_list(args) -> int:
    infos = list_runs(args.results)
    if args.json:
        print(json.dumps([{
            "run_id": i.run_id, "path": str(i.path), "date": i.date.isoformat() if i.date else None,
            "models": list(i.models), "methods": list(i.methods), "budgets": list(i.budgets), "tasks": list(i.tasks),
            "commit": i.commit, "items": i.n_records, "complete": i.complete, "state": i.state or None,
            "problem": i.problem,
        } for i in infos], indent=2))
        return EXIT_OK
    if not infos:
        print(f"no runs under {Path(args.results) / 'runs'}")
        return EXIT_OK
    rows = []
    for i in infos:
        date = i.date.strftime("%Y-%m-%d %H:%M") if i.date else "-"
        if i.problem:
            rows.append([i.run_id, date, "", "", "", "", "", "", f"unreadable: {i.problem}"])
            continue
        rows.append([i.run_id, date, ", ".join(i.models), ", ".join(i.methods), ", ".join(i.budgets),
                     ", ".join(i.tasks), (i.commit or "-")[:10], i.n_records, i.state])
    print(tabulate(rows, headers=["run", "date", "models", "methods", "budgets", "tasks", "commit", "items", "state"],
                   disable_numparse=True))
    return EXIT_OK


def _reproduce_lines(run: Run) -> list[str]:
    sources = run.info.get("merged_from") if isinstance(run.info.get("merged_from"), list) else None
    if sources:
        lines = [f"# {run.run_id} was merged by `kvbench merge` from {len(sources)} runs; each was made by:"]
        for source in sources:
            env = source.get("environment") or {}
            lines += [f"# -- {source.get('run_id')}"] + _commands(env, source.get("run_id"))
        return lines
    return _commands(run.environment, run.run_id)


def _commands(env: dict, run_id: str | None) -> list[str]:
    command, commit, cwd = env.get("command"), env.get("git_commit"), env.get("cwd")
    if not command:
        raise RunError(f"run {run_id} does not record the command that made it (no environment.command in run.json)")
    lines = []
    if commit:
        if env.get("git_dirty"):
            lines.append("# warning: the working tree had uncommitted changes; they are not part of the commit")
        lines.append(f"git checkout {commit}")
    else:
        lines.append("# commit unknown (the run was not made in a git checkout)")
    if cwd:
        lines.append(f"cd {shlex.quote(str(cwd))}")
    lines.append(command)
    return lines


def _device_line(records: list[Record]) -> str:
    """What the run's items ran on: GPU name and driver, or CPU model and threads (from the records)."""
    described = []
    for r in records:
        device = r.device
        if not device.name:
            continue
        details = [str(device.type)] if device.type else []
        if device.driver:
            details.append(f"driver {device.driver}")
        elif device.threads:
            details.append(f"{device.threads} thread(s)")
        text = device.name + (f" ({', '.join(details)})" if details else "")
        if text not in described:
            described.append(text)
    return "; ".join(described) or "-"


def cmd_tasks(args) -> int:
    try:
        rows = task_listing(args.suite)
    except TaskError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [[r["task"], r["suite"], r["metric"], r["max_new_tokens"], r["source"], r["missing"] or "yes"] for r in rows]
    print(tabulate(table, headers=["task", "suite", "metric", "max new tokens", "data", "available"], tablefmt="github"))
    return 0


def cmd_show(args) -> int:
    run = load(args, args.run)
    if args.reproduce:
        print("\n".join(_reproduce_lines(run)))
        return EXIT_OK
    statuses: dict[str, int] = defaultdict(int)
    for r in run.records:
        statuses[str(r.status or "unknown")] += 1
    info = run.info
    print(f"run {run.run_id} ({run.state.label()})")
    print(f"path: {run.path}")
    print(f"date: {run.started or '-'}   duration: {fmt(info.get('duration_s'), 1)} s")
    print(f"commit: {run.commit or '-'}{' (dirty)' if run.dirty else ''}")
    print(f"command: {run.command or '-'}")
    print(f"device: {_device_line(run.records)}")
    print("items: " + str(len(run.records)) + (" (" + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) + ")" if statuses else ""))
    if run.scored_records:
        print()
        print(to_markdown(run.records).rstrip())
    rows = []
    for r in sorted(run.records, key=lambda r: r.key):
        latency, memory = r.latency, r.memory
        rows.append([r.item_id or r.key, "-" if r.seed is None else r.seed, r.status or "-", fmt(r.score),
                     "-" if r.n_samples is None else r.n_samples, fmt(latency.total_s, 3), fmt(memory.peak_bytes, 1, MiB),
                     fmt(memory.kv_bytes_after, 2, MiB), fmt(memory.compression_ratio, 2)])
    if rows:
        print()
        print(tabulate(rows, headers=["item", "seed", "status", "score", "samples", "latency s", "peak MiB", "KV MiB",
                                      "compression"], disable_numparse=True))
    problems = [r for r in run.records if r.status in ("failed", "error") and r.message]
    for r in problems:
        print(f"{r.status}: {r.item_id or r.key}: {str(r.message).splitlines()[0]}")
    for u in run.state.unfinished_items:  # the state's own list (results/run/state.py), as every command reads it
        print(f"not finished: {u.get('item_id')}: {u.get('reason')}")
    for c in run.state.crashed:
        print(f"crashed, then run again: {c.get('item_id')}: {c.get('message')}")
    if run.state.unfinished_items and info.get("resume_command"):
        print(f"finish the run with: {info['resume_command']}")
    elif not run.state.complete and not run.state.damaged:
        print(f"finish the run with: {run.command or 'pytest bench/'} --kvbench-resume {run.run_id}")
    print()
    print("environment:")
    for name, value in sorted(run.environment.items()):
        if name == "packages":
            value = f"{len(value)} recorded (kvbench env {run.run_id})"
        elif isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        print(f"  {name}: {value}")
    return EXIT_OK


def cmd_env(args) -> int:

    run = load(args, args.run)
    try:
        commands = _reproduce_lines(run)
    except RunError as exc:
        commands = [f"# {exc}"]
    sys.stdout.write(reproduction_text(run, commands))
    return EXIT_OK


def cmd_merge(args) -> int:
    out = args.into or args.results  # checked writable by check_output_paths
    run_id = merge_runs(args.runs, out, results_dir=args.results)
    merged = load_run(run_id, out)
    for source in (load_run(spec, args.results) for spec in args.runs):
        print(f"run {source.run_id} is {source.state.label()}")
    print(f"merged {len(args.runs)} runs ({len(merged.records)} items) into {run_id} ({merged.path}): "
          f"{merged.state.label()}")
    return EXIT_OK
