"""Replays a finished single-process run through the progress ETA models and reports how far off they were.

For each point of the run past ``--from`` (default 20%) of its items (at each item's start and after its first
sample, the item's samples assumed evenly timed), the remaining time each model would have shown is compared
with the real remainder (the item seconds recorded after that point). Prints, per model, the worst ratio
shown / real on either side (2.0 means off by a factor of 2) and the point where it happened.

    python scripts/measure/measure_progress_eta.py results/runs/<run_id>
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import common  # noqa: F401 (this checkout's packages first)

from pytest_kvbench.results.record import Record
from pytest_kvbench.wiring.progress.eta import GroupedEstimate, PlannedItem


def planned_of(record: Record, samples: int | None) -> PlannedItem:
    task = record.task
    group = (record.model.name, task.name, task.context_length, record.seed, record.protocol)
    return PlannedItem(record.key, group, samples, task.context_length)


def mean_prompt_tokens(record: Record) -> float:
    tokens = [s["prompt_tokens"] for s in record.samples if s.get("prompt_tokens")]
    return sum(tokens) / len(tokens) if tokens else 0.0


def replay(records: list[Record], start_fraction: float, samples: int | None, tail: float):
    seconds = [float(r.latency.total_s) for r in records]
    estimate = GroupedEstimate([planned_of(r, samples) for r in records])
    worst = {"grouped": (1.0, None), "mean item": (1.0, None)}
    for index, record in enumerate(records):
        estimate.start(record.key)
        samples = max(1, int(record.n_samples or 1))
        for done in (0, 1):
            elapsed = seconds[index] * done / samples
            real = sum(seconds[index:]) - elapsed
            if index < start_fraction * len(records) or real <= tail * sum(seconds):
                continue
            shown = {
                "grouped": estimate.remaining(record.key, done, samples if done else 0, elapsed),
                "mean item": (len(records) - index) * sum(seconds[:index]) / index if index else None,
            }
            for model, value in shown.items():
                if value is None:
                    continue
                ratio = max(value / real, real / value) if value > 0 else float("inf")
                if ratio > worst[model][0]:
                    worst[model] = (ratio, f"item {index + 1}/{len(records)} ({record.key}, sample {done}): "
                                           f"shown {value:.0f} s, real {real:.0f} s")
        estimate.finish(record.key, seconds[index], int(record.n_samples or 0), mean_prompt_tokens(record))
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run directory (holds records.jsonl)")
    parser.add_argument("--from", dest="start", type=float, default=0.2, help="fraction of the run to start at")
    parser.add_argument("--samples", type=int, default=None, help="the run's --kvbench-samples (the plan's)")
    parser.add_argument("--tail", type=float, default=0.05,
                        help="leave out the points whose real remainder is under this fraction of the run")
    args = parser.parse_args(argv)
    lines = (args.run / "records.jsonl").read_text().splitlines()
    records = [Record.from_json(json.loads(line)) for line in lines if line.endswith("}")]
    print(f"{len(records)} items, {sum(float(r.latency.total_s) for r in records):.0f} s of items; points past "
          f"{args.start:.0%} of the items whose real remainder is at least {args.tail:.0%} of the run")
    for model, (ratio, where) in replay(records, args.start, args.samples, args.tail).items():
        print(f"{model:>10}: worst factor {ratio:.2f}; {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
