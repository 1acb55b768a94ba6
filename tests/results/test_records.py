"""The typed record: one serializer, a schema version, the migration of records written before it.

tests/results/data/run_v1 holds four run directories that main wrote before records were typed (commit 6c49ac1:
smoke items full/snapkv on RULER, LongBench and SCBench; a run gated against baseline.json, so with
verdicts; a seed-1 run; a query_agnostic run). They are version 1 records: no ``schema_version``.
Every read command must still load them, and a record must survive a read and a write unchanged.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cli_support import assert_usage_error, run_cli

from kvmethods import Budget
from pytest_kvbench.results.record import Device, Latency, MeterScope, Record, RecordError, mean_of_present
from pytest_kvbench.results.run.environment import with_fields
from pytest_kvbench.results.record.serializer import from_json, to_json
from pytest_kvbench.record_key import ItemKey
from pytest_kvbench.results.record.schema import SCHEMA_VERSION, RecordVersionError, migrate
from pytest_kvbench.results.run.directories import load_run
from pytest_kvbench.cases import Case, MethodSpec

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

V1 = Path(__file__).parent / "data" / "run_v1"
SAVED, GATED, SEED1, QUERY_AGNOSTIC = ("bench_133fd7b5_20261126_102216", "bench_672ced34_20261126_102355",
                                       "bench_75751ec8_20261126_102413", "bench_f946aa35_20261126_102425")


def v1_lines(run_id: str) -> list[dict]:
    return [json.loads(line) for line in (V1 / "runs" / run_id / "records.jsonl").read_text().splitlines()]


@pytest.fixture
def results(tmp_path) -> Path:
    """A copy of the version-1 results directory (merge writes into it)."""
    return Path(shutil.copytree(V1, tmp_path / "results"))


# -- version 1 records, migrated on read ------------------------------------------------------


def test_the_fixture_is_version_1():
    assert all("schema_version" not in r for run in (SAVED, GATED, SEED1, QUERY_AGNOSTIC) for r in v1_lines(run))


@pytest.mark.parametrize("run_id", [SAVED, GATED, SEED1, QUERY_AGNOSTIC])
def test_a_version_1_record_reads_typed_and_writes_back_with_nothing_lost(run_id):
    for line in v1_lines(run_id):
        record = Record.from_json(line)
        assert record.schema_version == SCHEMA_VERSION == 3
        # every field and value kept; no fingerprint was taken then (schema 3: benchmark null)
        assert record.to_json() == line | {"schema_version": 3, "benchmark": None}
        assert Record.from_json(record.to_json()) == record


def test_a_version_1_run_reads_as_typed_records_with_their_parts():
    run = load_run(GATED, V1)
    snapkv = next(r for r in run.records if r.key == "default|snapkv|128|niah_single_1@2048|seed0")
    assert snapkv.labels == ItemKey("default", "snapkv", "128", "niah_single_1@2048", "seed0")
    assert snapkv.is_scored and snapkv.is_finished and snapkv.score == 100.0
    assert snapkv.task.label == "niah_single_1@2048" and snapkv.task.suite == "ruler"
    assert snapkv.budget.kind == "tokens" and snapkv.budget.value == 128
    assert snapkv.method.params["window"] == 32 and snapkv.model.dtype == "float32"
    assert isinstance(snapkv.latency, Latency) and snapkv.latency.total_s > 0
    assert snapkv.memory.compression_ratio > 10 and snapkv.fidelity.agreement == 1.0
    assert isinstance(snapkv.device, Device) and snapkv.device.type == "cpu" and snapkv.device.threads == 1
    assert isinstance(snapkv.meter_scope, MeterScope)
    assert snapkv.verdict["status"] == "ok"
    assert len(snapkv.samples) == 2 and snapkv.sample_scores == [100.0, 100.0]
    scbench = next(r for r in run.records if r.task.name == "scbench_vt")
    assert scbench.task.history == "gold" and scbench.aggregate["turns"]


def test_a_version_1_protocol_run_keeps_its_protocol_in_key_and_field():
    for record in load_run(QUERY_AGNOSTIC, V1).records:
        assert record.protocol == record.labels.protocol == "query_agnostic"
        assert record.key.endswith("|protocol=query_agnostic")


def test_a_skipped_version_1_record_gets_empty_parts_and_a_protocol():
    skipped = {"run_id": "r", "item_id": "snapkv-128-qasper", "key": "default|snapkv|128|qasper|seed0",
               "model": {"name": "default"}, "method": {"name": "snapkv", "params": {}},
               "budget": {"spec": "128", "kind": "tokens", "value": 128}, "seed": 0,
               "task": {"name": "qasper", "suite": "longbench", "context_length": None}, "metric": None, "score": None,
               "samples": [], "nodeid": "bench/x.py::t[snapkv-128-qasper]", "status": "skipped", "message": "no data"}
    record = Record.from_json(skipped)
    assert record.protocol == "question_in_window" and not record.is_scored and not record.is_finished
    assert record.latency == Latency() and record.device == Device() and record.meter_scope is None
    written = record.to_json()
    assert written["latency"] == {"prefill_ms": None, "decode_tokens_per_s": None, "total_s": None}
    assert "meter_scope" not in written and "verdict" not in written and "crashed" not in written
    assert written["message"] == "no data" and written["protocol"] == "question_in_window"


def test_migration_leaves_its_input_as_it_was():
    line = v1_lines(SAVED)[0]
    before = json.dumps(line)
    assert migrate(line)["schema_version"] == SCHEMA_VERSION
    assert json.dumps(line) == before


@pytest.mark.parametrize("version, message", [
    (SCHEMA_VERSION + 1, f"schema version {SCHEMA_VERSION + 1} was written by a newer pytest-kvbench"),
    ("2", "must be a positive integer"), (0, "must be a positive integer"), (True, "must be a positive integer"),
])
def test_an_unknown_schema_version_is_refused(version, message):
    with pytest.raises(RecordVersionError, match=message):
        migrate({"schema_version": version})
    with pytest.raises(RecordError, match=message):
        Record.from_json(v1_lines(SAVED)[0] | {"schema_version": version})


def test_a_run_holding_a_newer_record_is_one_line_exit_2(capsys, results):
    path = results / "runs" / SEED1 / "records.jsonl"
    lines = v1_lines(SEED1)
    path.write_text("\n".join(json.dumps(r | {"schema_version": 9}) for r in lines) + "\n")
    code, _, err = run_cli(capsys, "show", SEED1, "--results", results)
    assert_usage_error(code, err, str(path), "record 1", "schema version 9", "upgrade pytest-kvbench")


@pytest.mark.parametrize("change, message", [
    ({"latency": [1, 2]}, "record.latency must be an object, found list"),
    ({"device": "cpu"}, "record.device must be an object, found str"),
    ({"key": 7}, "has no 'key' string"),
    ({"samples": [1]}, "malformed 'samples'"),
])
def test_a_malformed_part_is_named(change, message):
    with pytest.raises(RecordError, match=message):
        Record.from_json(v1_lines(SAVED)[0] | change)


# -- the serializer ---------------------------------------------------------------------------


def test_unknown_fields_survive_a_read_and_a_write_at_every_level():
    line = v1_lines(SAVED)[0]
    newer = line | {"tokenizer": {"name": "t"}, "latency": line["latency"] | {"queue_ms": 3.5},
                    "model": line["model"] | {"quantized": True}}
    record = Record.from_json(newer)
    assert record.extra == {"tokenizer": {"name": "t"}} and record.latency.extra == {"queue_ms": 3.5}
    assert record.model.extra == {"quantized": True}
    assert record.to_json() == newer | {"schema_version": SCHEMA_VERSION, "benchmark": None}


def test_fields_absent_at_their_default_stay_absent():
    assert to_json(Device(type="cuda", memory_bytes=80)) == {
        "type": "cuda", "name": None, "driver": None, "cuda_version": None, "cpu_model": None, "torch": None,
        "count": None, "memory_bytes": 80}
    assert from_json(Device, {"type": "cpu", "threads": 4}).threads == 4


# -- the key: built and parsed in one place ---------------------------------------------------


def _case(**changes) -> Case:
    fields = dict(model="org/model-1.5B", method=MethodSpec("my-a", (("window", "64"),)), budget=Budget.parse("r0.5"),
                  task="niah_single_1", suite="ruler", context_length=4096, seed=3, samples=2)
    return Case(**(fields | changes))


def test_a_case_key_parses_back_into_its_parts():
    key = _case(protocol="multi_turn").key
    assert key == "org/model-1.5B|my-a(window=64)|r0.5|niah_single_1@4096|seed3|protocol=multi_turn"
    assert ItemKey.parse(key) == ItemKey("org/model-1.5B", "my-a(window=64)", "r0.5", "niah_single_1@4096", "seed3",
                                         "multi_turn")
    assert ItemKey.parse(key).configuration == "org/model-1.5B|my-a(window=64)|r0.5|niah_single_1@4096|protocol=multi_turn"
    assert _case(context_length=None).key == "org/model-1.5B|my-a(window=64)|r0.5|niah_single_1|seed3"


def test_identity_names_the_record_from_its_case():
    case = _case()
    record = Record.identity(case, "run", case.protocol)
    assert record.key == case.key and record.labels == ItemKey.parse(case.key)
    assert record.budget.spec == "r0.5" and record.budget.kind == "ratio" and record.task.context_length == 4096
    finished = record.finished(status="failed", nodeid="n", message="boom")
    assert (finished.status, finished.nodeid, finished.message) == ("failed", "n", "boom")
    with pytest.raises(ValueError, match="status must be one of"):
        record.finished(status="crashed", nodeid="n")


_PART = st.text("abz09_-.:=()/@ +", min_size=1, max_size=12)  # what names, specs and labels are made of, but "|"


@settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(model=_PART, method=st.lists(_PART, min_size=1, max_size=3).map("|".join), budget=_PART, task=_PART,
       context_length=st.none() | st.integers(1, 10**6), seed=st.integers(0, 10**6),
       protocol=st.sampled_from(["question_in_window", "query_agnostic", "shared_context", "multi_turn"]))
def test_every_key_parses_back_into_the_parts_it_was_built_from(model, method, budget, task, context_length, seed,
                                                                 protocol):
    built = ItemKey.of(model, method, budget, task, context_length, seed, protocol)
    assert ItemKey.parse(built.text) == built


# -- every read command on a version 1 results directory -------------------------------------


def test_show_and_export_read_a_version_1_run(capsys, results):
    code, out, _ = run_cli(capsys, "show", SAVED, "--results", results)
    assert code == 0 and "items: 6 (6 passed)" in out and "device: AMD EPYC (cpu, 1 thread(s))" in out
    assert "| snapkv   | 100.00               | 0.00                   | 0.00         | 33.33 |" in out
    code, out, _ = run_cli(capsys, "export", QUERY_AGNOSTIC, "--format", "csv", "--results", results)
    rows = out.splitlines()
    assert code == 0 and len(rows) == 3 and all(",query_agnostic," in row for row in rows[1:])
    code, out, _ = run_cli(capsys, "export", SAVED, "--format", "json", "--results", results)
    assert code == 0 and len(json.loads(out)["records"]) == 6


def test_compare_gates_a_version_1_run_against_a_version_1_run_and_baseline_file(capsys, results):
    code, out, _ = run_cli(capsys, "compare", SAVED, GATED, "--results", results)
    assert code == 0 and "kvbench compare: 6 ok" in out
    code, out, _ = run_cli(capsys, "compare", results / "baseline.json", GATED, "--results", results)
    assert code == 0 and "kvbench compare: 6 ok" in out


def test_report_reads_version_1_runs(capsys, results):
    page = results / "report.html"
    code, _, _ = run_cli(capsys, "report", SAVED, GATED, "-o", page, "--results", results)
    assert code == 0 and "niah_single_1@2048" in page.read_text()


def test_merge_writes_current_records_that_read_back(capsys, results):
    code, out, _ = run_cli(capsys, "merge", SAVED, SEED1, "--results", results)
    assert code == 0 and "merged 2 runs (8 items)" in out
    merged = load_run(out.split(" into ")[1].split()[0], results)
    lines = [json.loads(line) for line in (merged.path / "records.jsonl").read_text().splitlines()]
    assert all(line["schema_version"] == SCHEMA_VERSION for line in lines)
    assert {r.merged_from_run for r in merged.records} == {SAVED, SEED1}
    by_key = {r["key"]: r for r in v1_lines(SAVED) + v1_lines(SEED1)}
    for line in lines:  # a merged record is its source record, renamed into the merged run
        source = by_key[line["key"]]
        assert line == source | {"schema_version": SCHEMA_VERSION, "benchmark": None, "run_id": merged.run_id, "merged_from_run": line["merged_from_run"]}


def test_the_mean_of_record_figures_leaves_missing_values_out():
    """One treatment of a missing value for every mean of measurements (the runner's fidelity and kept tokens, the
    KV-cache and latency figures, the tables' cells): left out, neither 0 nor a NaN that spreads."""
    assert mean_of_present([1, None, 2, float("nan"), float("inf"), True, "3"]) == 1.5
    assert mean_of_present(value for value in [0.25, 0.5]) == 0.375  # any iterable, read once
    assert mean_of_present([None, float("nan")]) is None and mean_of_present([]) is None
    values = [0.1] * 10  # summed left to right, as records always were (fsum would give exactly 0.1)
    assert mean_of_present(values) == sum(values) / 10 != 0.1


def test_fields_of_a_users_own_join_extra_and_survive_a_write_and_a_read():
    """What the pytest_kvbench_record_fields hook returns: top-level keys on disk, `extra` when typed again."""
    case = _case()
    record = Record.identity(case, "run", case.protocol).with_fields({"tracker": "nightly", "ticket": 48})
    data = record.to_json()
    assert data["tracker"] == "nightly" and data["ticket"] == 48
    assert Record.from_json(json.loads(json.dumps(data))).extra == {"tracker": "nightly", "ticket": 48}
    with pytest.raises(RecordError, match="'score'.*a field every record declares"):
        record.with_fields({"score": 1.0, "mine": 2})


def test_the_environment_takes_fields_of_a_users_own_but_never_over_its_own():
    captured = {"git_commit": "abc", "host": "h"}
    assert with_fields(captured, [{"cluster": "lab-a"}, None]) == {"git_commit": "abc", "host": "h", "cluster": "lab-a"}
    with pytest.raises(ValueError, match="'host'.*already has it"):
        with_fields(captured, [{"host": "mine"}])

