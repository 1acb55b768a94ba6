"""A real run on the embedded model: records through the hook, run directory, RESULTS.md."""

import json
import re
import xml.etree.ElementTree as ET

import pytest

from helpers import hook_records

RECORD_FIELDS = {
    "run_id", "nodeid", "item_id", "key", "model", "method", "budget", "protocol", "seed", "task",
    "metric", "score", "samples", "latency", "memory", "fidelity", "status",
}
SAMPLE_FIELDS = {"id", "prediction", "references", "score", "prompt_tokens", "kept_tokens",
                 "kept_tokens_per_layer", "prefill_ms", "decode_ms", "new_tokens", "kl", "agreement", "decode_kl", "stop"}


@pytest.fixture
def bench_run(small_run):
    return small_run


def test_a_run_records_every_item_once_through_the_hook(bench_run):
    work, proc, results, _ = bench_run
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "6 passed" in proc.stdout
    calls = hook_records(work)
    assert len(calls) == 6
    assert len({c["nodeid"] for c in calls}) == 6
    for call in calls:
        record = call["record"]
        assert RECORD_FIELDS <= set(record)
        assert record["status"] == "passed"
        assert record["nodeid"] == call["nodeid"]
        assert record["samples"] and SAMPLE_FIELDS <= set(record["samples"][0])
        assert {"prefill_ms", "decode_tokens_per_s", "total_s"} <= set(record["latency"])
        assert {"peak_bytes", "kv_bytes_before", "kv_bytes_after", "compression_ratio"} <= set(record["memory"])
        assert 0 <= record["score"] <= 100


def test_compressed_items_keep_the_budget_and_full_is_exact(bench_run):
    work, _, _, _ = bench_run
    records = {c["record"]["item_id"]: c["record"] for c in hook_records(work)}
    snap = records["snapkv-32-niah_single_1-ctx256"]
    assert all(max(s["kept_tokens_per_layer"]) <= 32 for s in snap["samples"])
    assert snap["memory"]["kv_bytes_after"] < snap["memory"]["kv_bytes_before"]
    full = records["full-niah_single_1-ctx256"]
    assert full["fidelity"] == {"kl": 0.0, "agreement": 1.0, "decode_kl": 0.0}
    assert all(s["kept_tokens"] == s["prompt_tokens"] for s in full["samples"])


def test_every_decode_runs_to_max_new_tokens_unless_it_stops_at_eos(bench_run):
    """Compressed and reference items alike: a decode cut short (half the tokens, say) passed every gate."""
    from pytest_kvbench.tasks import get_task

    work, _, _, _ = bench_run
    records = [c["record"] for c in hook_records(work)]
    assert {r["method"]["name"] for r in records} == {"full", "streamingllm", "snapkv"}
    lengths = []
    for record in records:
        limit = get_task(record["task"]["name"]).max_new_tokens
        for sample in record["samples"]:
            lengths.append(sample["new_tokens"])
            if sample["stop"] == "eos":
                assert sample["new_tokens"] < limit, (record["key"], sample["id"])
            else:
                assert sample["stop"] == "max_new_tokens" and sample["new_tokens"] == limit, (record["key"], sample)
    assert max(lengths) > 0


def test_the_model_is_loaded_once_for_many_items(bench_run):
    work, _, _, _ = bench_run
    records = [c["record"] for c in hook_records(work)]
    assert sum(r["model"]["loaded_by_this_item"] for r in records) == 1


def test_run_directory_and_results_md_are_written_and_parseable(bench_run):
    _, _, results, _ = bench_run
    (run_dir,) = (results / "runs").iterdir()
    assert re.fullmatch(r"bench_[0-9a-f]{8}_\d{8}_\d{6}", run_dir.name)
    run = json.loads((run_dir / "run.json").read_text())
    assert run["run_id"] == run_dir.name and run["complete"] is True
    assert {"start", "end", "duration_s", "grid", "environment", "records", "summary"} <= set(run)
    env = run["environment"]
    assert {"git_commit", "git_dirty", "command", "python", "versions"} <= set(env)
    assert len(run["records"]) == 6
    item = run_dir / "snapkv_default_32" / "niah_single_1_256"
    predictions = [json.loads(l) for l in (item / "predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 2
    assert json.loads((item / "metrics.json").read_text())["item_id"] == "snapkv-32-niah_single_1-ctx256"
    table = (results / "RESULTS.md").read_text()
    assert "## default — budget 32" in table
    averages, per_budget = table.split("## default — budget 32")
    assert "### default — Avg over 2 tasks" in averages  # the compact table first, method x budget
    header = next(line for line in per_budget.splitlines() if line.startswith("| Method"))
    assert "niah_single_1@256" in header and "passage_retrieval_en" in header and "Avg" in header
    rows = [line for line in per_budget.splitlines() if line.startswith("| full") or line.startswith("| snapkv")]
    assert rows[0].startswith("| full")


def test_junit_xml_carries_the_key_figures(bench_run):
    _, _, _, tmp_path = bench_run
    tree = ET.parse(tmp_path / "j.xml")
    names = {p.get("name") for p in tree.iter("property")}
    assert {"kvbench_score", "kvbench_kl", "kvbench_total_s"} <= names
