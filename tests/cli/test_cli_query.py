"""kvbench query: SQL over every run (views runs, items, samples), checked against the records field by field, on
the committed v1 runs (written before records were typed) and on a fresh real run; and the Parquet export of the
same tables, read back by `datasets`."""

import csv
import io
import json
import math
import re
from pathlib import Path

import pytest
from test_cli_support import ENVIRONMENT, RUN_ID, OTHER_ID, assert_usage_error, run_cli, standard_records, write_run

from pytest_kvbench.results.query.columns import TABLES
from pytest_kvbench.results.record import Record
from pytest_kvbench.results.run import storage
from pytest_kvbench.results.run.directories import list_runs, load_run
from pytest_kvbench.results.views.table_model import TABLE_RESAMPLES
from pytest_kvbench.stats import bootstrap_mean

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

V1 = Path(__file__).parents[1] / "results" / "data" / "run_v1"
DOCS = Path(__file__).parents[2] / "docs" / "query.md"


def query(capsys, results, sql, *more):
    code, out, err = run_cli(capsys, "query", sql, "--results", results, "--json", *more)
    assert code == 0, err
    return json.loads(out)


def _same(value, expected):
    if isinstance(expected, float) and isinstance(value, float):
        return math.isclose(value, expected, rel_tol=1e-12)
    return value == expected


# What each items column must hold, read off the typed record (the mapping the view promises, docs/query.md)
ITEM_FIELDS = {
    "key": lambda r: r.key, "item_id": lambda r: r.item_id, "status": lambda r: r.status, "message": lambda r: r.message,
    "crashed": lambda r: r.crashed, "model": lambda r: r.model.name, "method": lambda r: r.method.name,
    "params": lambda r: r.method.params, "budget": lambda r: r.budget.spec, "budget_kind": lambda r: r.budget.kind,
    "budget_value": lambda r: r.budget.value, "protocol": lambda r: r.protocol, "task": lambda r: r.task.name,
    "suite": lambda r: r.task.suite, "context_length": lambda r: r.task.context_length, "seed": lambda r: r.seed,
    "metric": lambda r: r.metric, "score": lambda r: r.score, "n_samples": lambda r: r.n_samples,
    "kl": lambda r: r.fidelity.kl, "agreement": lambda r: r.fidelity.agreement,
    "decode_kl": lambda r: r.fidelity.decode_kl, "prefill_ms": lambda r: r.latency.prefill_ms,
    "decode_tokens_per_s": lambda r: r.latency.decode_tokens_per_s,
    "decode_tokens_per_s_alone": lambda r: r.latency.decode_tokens_per_s_alone,
    "total_s": lambda r: r.latency.total_s, "peak_bytes": lambda r: r.memory.peak_bytes,
    "memory_kind": lambda r: r.memory.kind, "peak_reserved_bytes": lambda r: r.memory.peak_reserved_bytes,
    "kv_bytes_before": lambda r: r.memory.kv_bytes_before, "kv_bytes_after": lambda r: r.memory.kv_bytes_after,
    "compression_ratio": lambda r: r.memory.compression_ratio, "energy_j": lambda r: r.energy_j,
}
SAMPLE_FIELDS = {"sample_id": "id", **{c: c for c in ("score", "prompt_tokens", "kept_tokens", "prefill_ms",
                                                       "decode_ms", "new_tokens", "kv_bytes_after", "kl",
                                                       "agreement", "decode_kl", "stop", "prediction")}}


def check_against_records(capsys, results):
    """Every run's items and samples rows hold what its records say, column by column."""
    items = query(capsys, results, "SELECT * FROM items")
    samples = query(capsys, results, "SELECT * FROM samples")
    runs = [load_run(info.path, results) for info in list_runs(results)]
    records = {(run.run_id, r.key): r for run in runs for r in run.records}
    assert len(items) == len(records) > 0
    assert sum(len(r.samples) for r in records.values()) == len(samples)
    for row in items:
        record = records[(row["run_id"], row["key"])]
        for column, field in ITEM_FIELDS.items():
            expected = field(record)
            value = json.loads(row[column]) if column == "params" else row[column]
            assert _same(value, expected), (row["key"], column, value, expected)
        scores = record.sample_scores
        if len(scores) >= 2:
            _, low, high = bootstrap_mean(scores, n_resamples=TABLE_RESAMPLES)
            assert (row["score_low"], row["score_high"]) == ((low, high) if math.isfinite(low) else (None, None))
            assert low <= row["score"] <= high or not math.isfinite(low)
        else:
            assert row["score_low"] is None and row["score_high"] is None
        stops = [s.get("stop") for s in record.samples]
        assert row["stops_eos"] == (stops.count("eos") if any(stops) else None)
        assert row["stops_max_new_tokens"] == (stops.count("max_new_tokens") if any(stops) else None)
    by_item: dict = {}
    for row in samples:
        by_item.setdefault((row["run_id"], row["key"]), []).append(row)
    for (run_id, key), rows in by_item.items():
        record_samples = records[(run_id, key)].samples
        assert len(rows) == len(record_samples)
        for row, sample in zip(rows, record_samples):
            for column, field in SAMPLE_FIELDS.items():
                assert _same(row[column], sample.get(field)), (key, column)
    return items, samples, runs


def test_the_v1_runs_read_back_field_by_field(capsys):
    items, samples, runs = check_against_records(capsys, V1)
    assert len(runs) == 4 and len(items) == 16 and all(r["decode_kl"] is None for r in items)  # v1: no decode_kl
    rows = query(capsys, V1, "SELECT * FROM runs ORDER BY run_id")
    for row, run in zip(rows, sorted(runs, key=lambda r: r.run_id)):
        env = run.info["environment"]
        assert row["run_id"] == run.run_id and row["state"] == "complete" and row["state_detail"] == "complete"
        assert (row["commit"], row["dirty"], row["command"]) == (env["git_commit"], env["git_dirty"], env["command"])
        assert json.loads(row["versions"]) == env["versions"] and row["items"] == len(run.records)
        assert row["start"] == run.info["start"] and row["end"] == run.info["end"]
        assert row["duration_s"] == run.info["duration_s"] and row["device"] == "AMD EPYC (1 threads)"


def test_a_fresh_run_reads_back_field_by_field(capsys, small_run):
    _, _, results, _ = small_run
    items, samples, _ = check_against_records(capsys, results)
    assert {r["method"] for r in items} == {"full", "streamingllm", "snapkv"}
    assert all(r["stop"] in ("eos", "max_new_tokens") for r in samples)  # newer records say why a decode ended
    assert all(r["stops_eos"] + r["stops_max_new_tokens"] == r["n_samples"] for r in items if r["n_samples"])


def test_sql_answers_a_question_across_runs(capsys, tmp_path):
    write_run(tmp_path, standard_records(RUN_ID), run_id=RUN_ID)
    write_run(tmp_path, standard_records(OTHER_ID, drop=1.0), run_id=OTHER_ID,
              environment=ENVIRONMENT | {"git_commit": "b" * 40})
    rows = query(capsys, tmp_path, "SELECT r.commit, avg(i.score) AS mean FROM items i JOIN runs r USING (run_id) "
                                   "WHERE i.method = 'snapkv' AND i.budget = '128' GROUP BY r.commit ORDER BY r.commit")
    expected = [r.score for r in map(Record.from_json, standard_records(RUN_ID))
                if r.method.name == "snapkv" and r.budget.spec == "128"]
    assert [r["commit"] for r in rows] == [ENVIRONMENT["git_commit"], "b" * 40]
    assert math.isclose(rows[0]["mean"], sum(expected) / len(expected))
    only = query(capsys, tmp_path, "SELECT DISTINCT run_id FROM items", "--run", OTHER_ID)
    assert only == [{"run_id": OTHER_ID}]


def test_crashed_unfinished_and_damaged_runs_are_there_with_their_state(capsys, tmp_path):
    records = standard_records()
    write_run(tmp_path, records[:3], run_id="bench_00000001_20250101_000001", with_run_json=False)  # killed
    write_run(tmp_path, records, run_id="bench_00000002_20250101_000002", complete=False)  # interrupted
    damaged = write_run(tmp_path, records, run_id="bench_00000003_20250101_000003")
    with open(damaged / storage.RECORDS_FILE, "a") as handle:
        handle.write("\x00 garbage\n")
    unreadable = tmp_path / "runs" / "bench_00000004_20250101_000004"
    unreadable.mkdir()
    (unreadable / storage.RECORDS_FILE).write_text("garbage\n")
    rows = query(capsys, tmp_path, "SELECT run_id, state, state_detail, items FROM runs ORDER BY run_id")
    assert [(r["state"], r["items"]) for r in rows] == [
        ("incomplete", 3), ("incomplete", 10), ("damaged", 10), ("unreadable", 0)]
    assert rows[0]["state_detail"].startswith("incomplete: no run.json")
    assert "records.jsonl:11: not a JSON record" in rows[2]["state_detail"]
    assert "not a JSON record" in rows[3]["state_detail"]
    code, out, err = run_cli(capsys, "query", "SELECT count(*) AS n FROM items", "--results", tmp_path,
                             "--run", damaged.name, "--csv")
    assert code == 2 and out == "n\n10\n"  # the answer, then the damaged run named in one line
    assert err.startswith(f"kvbench query: error: run {damaged.name} is damaged (") and err.count("\n") == 1


def test_output_as_a_table_json_or_csv(capsys, tmp_path):
    write_run(tmp_path, standard_records())
    sql = "SELECT method, budget, count(*) AS n, max(kl) AS kl FROM items GROUP BY ALL ORDER BY method, budget"
    code, table, _ = run_cli(capsys, "query", sql, "--results", tmp_path)
    assert code == 0 and re.match(r"method\s+budget\s+n\s+kl\n-+", table)
    assert re.search(r"^snapkv\s+128\s+2\s", table, re.M)
    code, text, _ = run_cli(capsys, "query", sql, "--results", tmp_path, "--csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert code == 0 and rows[0] == {"method": "full", "budget": "full", "n": "2", "kl": rows[0]["kl"]}
    assert [r["method"] for r in rows] == [r["method"] for r in query(capsys, tmp_path, sql)]


@pytest.mark.parametrize("sql, fragment", [
    ("SELECT nope FROM items", 'Binder Error: Referenced column "nope" not found'),
    ("SELEC 1", 'Parser Error: syntax error at or near "SELEC"'),
    ("SELECT * FROM records", "Catalog Error: Table with name records does not exist"),
])
def test_a_sql_error_is_duckdb_s_message_in_one_line(capsys, tmp_path, sql, fragment):
    write_run(tmp_path, standard_records())
    code, out, err = run_cli(capsys, "query", sql, "--results", tmp_path)
    assert_usage_error(code, err, "kvbench query: error: ", fragment)
    assert out == "" and "LINE 1" not in err


def test_an_unknown_run_is_one_line(capsys, tmp_path):
    write_run(tmp_path, standard_records())
    code, _, err = run_cli(capsys, "query", "SELECT 1", "--results", tmp_path, "--run", "bench_nope")
    assert_usage_error(code, err, "no run 'bench_nope'")


def test_parquet_export_loads_with_datasets_and_matches_the_query(capsys, tmp_path, monkeypatch):
    from datasets import load_dataset  # lazy for startup time: datasets (pyarrow, fsspec), this test only

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run_dir = write_run(tmp_path / "res", standard_records())
    code, _, err = run_cli(capsys, "export", RUN_ID, "--format", "parquet", "-o", tmp_path / "out",
                           "--results", tmp_path / "res")
    assert code == 0 and "wrote runs.parquet, items.parquet, samples.parquet" in err
    for table, columns in TABLES.items():
        loaded = load_dataset("parquet", data_files=str(tmp_path / "out" / f"{table}.parquet"), split="train",
                              cache_dir=str(tmp_path / "cache"))
        assert loaded.column_names == [c.name for c in columns]
        expected = query(capsys, tmp_path / "res", f"SELECT * FROM {table}")
        got = loaded.to_list()
        assert len(got) == len(expected) == {"runs": 1, "items": 10, "samples": 80}[table]
        for row, want in zip(got, expected):
            for name, value in row.items():
                value = value.isoformat() if hasattr(value, "isoformat") else value
                assert value == want[name] or (isinstance(value, float) and math.isclose(value, want[name]))
    assert loaded.features["score"].dtype == "float64" and not (run_dir / "items.parquet").exists()


def test_docs_list_every_column():
    text = DOCS.read_text()
    for table, columns in TABLES.items():
        section = text.split(f"### `{table}`", 1)[1].split("###", 1)[0]
        listed = re.findall(r"^\| `(\w+)` \|", section, re.M)
        assert listed == [c.name for c in columns], table


def test_a_blank_sql_is_one_line(capsys, tmp_path):
    code, out, err = run_cli(capsys, "query", " ", "--results", tmp_path)
    assert_usage_error(code, err, "SQL is empty")
    assert out == ""
