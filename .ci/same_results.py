"""Exit 1, naming the differences, unless two runs hold the same items with the same outcomes and scores.

Why: CI merges the shards of the README's SLURM job array (``.ci/slurm.sh``) and must show that the merged
run is the run a single process makes of the same grid: every item once, the same status, and the same
score, per-sample predictions and fidelity. Times, memory and devices differ between runs and are not
compared. Usage: ``python .ci/same_results.py RUN_A RUN_B`` (run directories).

``--exact`` (the determinism step, .ci/determinism.sh): the same grid run twice in one process setup must give
bitwise-equal records, every field but those that time or meter the run (VARYING) and the run's own id.
"""

from __future__ import annotations

import math
import sys

from pytest_kvbench.results.run.directories import RunError, load_run

# What an item measured, as opposed to how long it took or what it ran on.
ITEM_FIELDS = ("status", "score", "aggregate", "fidelity", "n_samples")
SAMPLE_FIELDS = ("id", "prediction", "score", "kept_tokens", "kl", "agreement")


# Fields that measure time, memory or energy, or name the run or the load: they differ between two identical runs.
VARYING = {"run_id", "nodeid", "latency", "load_s", "loaded_by_this_item", "peak_bytes", "peak_reserved_bytes",
           "peak_method", "energy_j", "energy_source", "supersedes"}
VARYING_SUFFIXES = ("_ms", "_s", "_per_s")


def measured(value):
    """The record (or part) without its VARYING fields, recursively."""
    if isinstance(value, dict):
        return {key: measured(item) for key, item in value.items()
                if key not in VARYING and not key.endswith(VARYING_SUFFIXES)}
    if isinstance(value, list):
        return [measured(item) for item in value]
    return value


def exact_differences(a: dict[str, dict], b: dict[str, dict], name_a: str, name_b: str) -> list[str]:
    """One line per item found in only one run, or per field path whose value differs (VARYING fields aside)."""
    lines = [f"only in {name_a}: {key}" for key in sorted(a.keys() - b.keys())]
    lines += [f"only in {name_b}: {key}" for key in sorted(b.keys() - a.keys())]

    def walk(key: str, path: str, left, right) -> None:
        if isinstance(left, dict) and isinstance(right, dict):
            for name in sorted(left.keys() | right.keys()):
                walk(key, f"{path}.{name}" if path else name, left.get(name), right.get(name))
        elif isinstance(left, list) and isinstance(right, list) and len(left) == len(right):
            for index, (x, y) in enumerate(zip(left, right)):
                walk(key, f"{path}[{index}]", x, y)
        elif left != right:
            lines.append(f"{key}: {path} {left!r} in {name_a}, {right!r} in {name_b}")

    for key in sorted(a.keys() & b.keys()):
        walk(key, "", measured(a[key]), measured(b[key]))
    return lines


def outcome(record: dict) -> dict:
    """The fields of a record that two runs of the same grid must agree on."""
    return {
        **{name: record.get(name) for name in ITEM_FIELDS},
        "samples": [{name: sample.get(name) for name in SAMPLE_FIELDS} for sample in record.get("samples") or []],
    }


# KL figures are sums of float32 log-probability differences: a shard decodes its samples in batches of other
# members (another padded shape, so another kernel) than one process does, and on some CPUs (seen on an AMD EPYC)
# that moves a KL in its fifth significant digit, at 7b7679d as now. Predictions, scores and agreement stay equal.
KL_FIELDS = ("kl", "decode_kl")
KL_TOLERANCE = {"rel_tol": 1e-3, "abs_tol": 1e-9}


def same(left, right, name: str = "") -> bool:
    """Equal, but a KL figure within KL_TOLERANCE of the other."""
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(same(left[k], right[k], k) for k in left)
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(same(x, y, name) for x, y in zip(left, right))
    if name in KL_FIELDS and isinstance(left, float) and isinstance(right, float):
        return math.isclose(left, right, **KL_TOLERANCE)
    return left == right


def differences(a: dict[str, dict], b: dict[str, dict], name_a: str, name_b: str) -> list[str]:
    """One line per item key found in only one run, or whose outcomes differ (a KL within KL_TOLERANCE)."""
    lines = [f"only in {name_a}: {key}" for key in sorted(a.keys() - b.keys())]
    lines += [f"only in {name_b}: {key}" for key in sorted(b.keys() - a.keys())]
    for key in sorted(a.keys() & b.keys()):
        left, right = outcome(a[key]), outcome(b[key])
        for field in left:
            if not same(left[field], right[field], field):
                lines.append(f"{key}: {field} {left[field]!r} in {name_a}, {right[field]!r} in {name_b}")
    return lines


def main(argv: list[str]) -> int:
    exact = "--exact" in argv
    argv = [arg for arg in argv if arg != "--exact"]
    if len(argv) != 2:
        print("usage: same_results.py [--exact] RUN_A RUN_B", file=sys.stderr)
        return 2
    try:
        run_a, run_b = (load_run(path) for path in argv)
    except RunError as exc:
        print(f"same_results: {exc}", file=sys.stderr)
        return 2
    damaged = [run for run in (run_a, run_b) if run.state.damaged]  # read as far as it goes: not a result
    for run in damaged:
        print(f"same_results: run {run.run_id} is {run.state.label()}", file=sys.stderr)
    if damaged:
        return 2
    records_a = {r.key: r.to_json() for r in run_a.records}  # compared in their written (JSON) form
    records_b = {r.key: r.to_json() for r in run_b.records}
    compare = exact_differences if exact else differences
    found = compare(records_a, records_b, *argv)  # named as given: a copied run keeps its run id
    if len(records_a) != len(run_a.records) or len(records_b) != len(run_b.records):
        found.append("an item key appears twice in one run")
    if not records_a:
        found.append(f"{argv[0]} holds no records")
    for line in found:
        print(line)
    if found:
        return 1
    what = "bitwise-equal records (timings aside)" if exact else "same items and scores"
    print(f"{what}: {run_a.run_id} and {run_b.run_id}, {len(records_a)} items")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
