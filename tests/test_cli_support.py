"""Builders of realistic records and run directories for the baseline, CLI and report tests.

Records have exactly the fields of DEVELOPERS.md ("Contract: records") and the key/item id
spelling of grid.Case; run directories are written the way the session (results/run/writer.py)
writes them (records appended with storage.append_record, run.json with the same fields). The
test at the bottom keeps these builders honest against the contract.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kvbench import atomic_files
from pytest_kvbench.results.run import storage
from pytest_kvbench.results.record import Record

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

RUN_ID = "bench_0a1b2c3d_20250102_030405"
OTHER_ID = "bench_9f8e7d6c_20250103_101010"
ENVIRONMENT = {
    "git_commit": "3f2a9c1d5e7b8a6f4c2d0e1f3a5b7c9d1e3f5a7b",
    "git_dirty": False,
    "command": "pytest bench --kvbench-methods snapkv,streamingllm --kvbench-budgets 128,512",
    "cwd": "/home/user/pytest-kvbench",
    "host": "gpu-node-1",
    "platform": "Linux-6.1-x86_64",
    "python": "3.11.9",
    "versions": {"torch": "2.13.0", "transformers": "5.23.0", "pytest": "9.0.0"},
}
SAMPLE_FIELDS = ("id", "prediction", "references", "score", "prompt_tokens", "kept_tokens", "kept_tokens_per_layer",
                 "prefill_ms", "decode_ms", "new_tokens", "kl", "agreement")
RECORD_FIELDS = ("run_id", "nodeid", "item_id", "key", "status", "message", "model", "method", "budget", "protocol",
                 "seed", "task", "metric", "score", "n_samples", "aggregate", "samples", "latency", "memory",
                 "fidelity", "device", "energy_j")


def make_samples(scores, *, prefix="qasper", latency_ms=(40.0, 60.0), fields=None, kept=128):
    """Per-sample rows; ``latency_ms`` is (prefill, decode) or a list of such pairs per sample."""
    rows = []
    for index, score in enumerate(scores):
        prefill, decode = latency_ms[index] if isinstance(latency_ms[0], (tuple, list)) else latency_ms
        row = {
            "id": f"{prefix}-{index:03d}",
            "prediction": "the answer" if score else "something else",
            "references": ["the answer"],
            "score": float(score),
            "prompt_tokens": 900 + index,
            "kept_tokens": float(kept),
            "kept_tokens_per_layer": [kept, kept],
            "prefill_ms": float(prefill),
            "decode_ms": float(decode),
            "new_tokens": 8,
            "kl": 0.01 * index,
            "agreement": 1.0 - 0.001 * index,
        }
        if fields is not None:
            row["fields"] = fields[index]
        rows.append(row)
    return rows


def make_record(scores=(1, 0, 1, 1), *, model="default", method="snapkv", params=None, budget="128",
                task="qasper", suite="longbench", metric="f1", context_length=None, seed=0, run_id=RUN_ID,
                status="passed", protocol="question_in_window", kv_bytes=2_000_000, peak_bytes=50_000_000,
                total_s=None, samples=None, label=None, show_seed=False):
    """A record as runner.py + the plugin produce it for one item."""
    params = {"window": 32, "kernel": 5} if params is None and method == "snapkv" else (params or {})
    label = label or method
    samples = samples if samples is not None else make_samples(scores, prefix=task)
    ctx = f"@{context_length}" if context_length is not None else ""
    id_parts = [label] + ([] if budget == "full" else [budget]) + [task]
    id_parts += [f"ctx{context_length}"] if context_length is not None else []
    id_parts += [f"seed{seed}"] if show_seed else []
    item_id = "-".join(id_parts)
    kind = "none" if budget == "full" else ("ratio" if budget.startswith("r") else "tokens")
    value = None if budget == "full" else (float(budget[1:]) if kind == "ratio" else int(budget))
    score = None if status in ("error", "skipped") else (round(100 * sum(s["score"] for s in samples) / len(samples), 2) if samples else None)
    before = 8_000_000
    return {
        "run_id": run_id,
        "nodeid": f"bench/test_{suite}.py::test_{suite}[{item_id}]",
        "item_id": item_id,
        "key": f"{model}|{label}|{budget}|{task}{ctx}|seed{seed}",
        "status": status,
        "message": "" if status == "passed" else f"{status}: something went wrong",
        "model": {"name": model, "source": "embedded", "dtype": "float32", "attn_implementation": "sdpa",
                  "family": "llama", "load_s": 0.4, "size_bytes": 30_000_000},
        "method": {"name": method, "params": params},
        "budget": {"spec": budget, "kind": kind, "value": value},
        "protocol": protocol,
        "seed": seed,
        "task": {"name": task, "suite": suite, "metric": metric, "context_length": context_length},
        "metric": metric,
        "score": score,
        "n_samples": len(samples) if score is not None else 0,
        "aggregate": {"score": score},
        "samples": samples if score is not None else [],
        "latency": {"prefill_ms": 40.0, "decode_tokens_per_s": 200.0,
                    "total_s": total_s if total_s is not None else sum(s["prefill_ms"] + s["decode_ms"] for s in samples) / 1000},
        "memory": {"peak_bytes": peak_bytes, "kind": "cuda", "kv_bytes_before": before,
                   "kv_bytes_after": kv_bytes if budget != "full" else before,
                   "compression_ratio": before / kv_bytes if budget != "full" else 1.0},
        "fidelity": {"kl": 0.02, "agreement": 0.97},
        "device": {"type": "cuda", "name": "NVIDIA H100", "driver": "550.54.15", "count": 1},
        "energy_j": 12.5,
    }


def write_run(results_dir, records, *, run_id=RUN_ID, environment=None, complete=True, with_run_json=True,
              grid=None):
    """A run directory as the session leaves it: records.jsonl appended item by item, then run.json."""
    run_dir = Path(results_dir) / "runs" / run_id
    records = [r | {"run_id": run_id} for r in records]
    for record in records:
        storage.append_record(run_dir / storage.RECORDS_FILE, record)
    if with_run_json:
        atomic_files.atomic_write_json(run_dir / storage.RUN_FILE, {
            "schema": 1,
            "run_id": run_id,
            "start": "2025-01-02T03:04:05+00:00",
            "start_ts": 1735787045.0,
            "end": "2025-01-02T03:14:05+00:00",
            "duration_s": 600.0,
            "complete": complete,
            "resumed": False,
            "grid": grid or {
                "models": sorted({r["model"]["name"] for r in records}),
                "methods": [{"name": m, "params": {}} for m in sorted({r["method"]["name"] for r in records})],
                "budgets": sorted({r["budget"]["spec"] for r in records if r["budget"]["spec"] != "full"}),
                "tasks": sorted({r["task"]["name"] for r in records}),
                "context_lengths": [], "samples": 4, "seeds": sorted({r["seed"] for r in records}),
                "protocol": "question_in_window", "dtype": "auto", "attn_implementation": "sdpa",
                "data_dir": None, "max_prompt_tokens": None,
            },
            "environment": environment if environment is not None else ENVIRONMENT,
            "summary": {"items": len(records)},
            "records": records,
        })
    return run_dir


def typed(record: dict) -> Record:
    """The in-memory record of one built here (builders return the JSON form, as files and the hook hold it)."""
    return Record.from_json(record)


def typed_all(records: list[dict]) -> list[Record]:
    return [Record.from_json(r) for r in records]


def standard_records(run_id=RUN_ID, seeds=(0,), drop=0.0):
    """A small grid: full + two methods x two budgets x two tasks, realistic per-sample scores."""
    records = []
    base = {"qasper": [1, 0, 1, 1, 0, 1, 1, 0], "hotpotqa": [0.5, 1, 1, 0, 1, 0.25, 1, 1]}
    for seed in seeds:
        for task, scores in base.items():
            records.append(make_record(scores, method="full", budget="full", task=task, seed=seed, run_id=run_id,
                                       show_seed=len(seeds) > 1))
            for method, penalty in (("snapkv", 0), ("streamingllm", 1)):
                for budget in ("128", "512"):
                    shifted = list(scores)
                    for i in [i for i, s in enumerate(scores) if s][:penalty + (budget == "128")]:
                        shifted[i] = 0  # each step of penalty loses one more answer
                    records.append(make_record(shifted, method=method, budget=budget, task=task, seed=seed,
                                               run_id=run_id, kv_bytes=int(budget) * 8_000,
                                               show_seed=len(seeds) > 1))
    return records


def run_cli(capsys, *argv):
    """Run ``kvbench`` in-process: (exit code, stdout, stderr)."""
    from pytest_kvbench.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_usage_error(code, err, *fragments):
    """Bad input: exit code 2 and a single line on stderr containing every fragment, no traceback."""
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_records_carry_every_contract_field():
    record = make_record()
    assert set(RECORD_FIELDS) <= set(record)
    assert all(set(SAMPLE_FIELDS) <= set(s) for s in record["samples"])
    assert record["key"] == "default|snapkv|128|qasper|seed0"
    assert record["score"] == 75.0
    json.dumps(record, allow_nan=False)


def test_written_run_reads_back_with_storage(tmp_path):
    run_dir = write_run(tmp_path, standard_records())
    assert len(storage.read_records(run_dir / storage.RECORDS_FILE)) == 10
    assert json.loads((run_dir / storage.RUN_FILE).read_text())["run_id"] == RUN_ID
