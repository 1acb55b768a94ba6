"""--kvbench-wandb with WANDB_MODE=offline: the run directory W&B writes for `wandb sync` is read back (its .wandb
log, a LevelDB-style log of the client's own protobuf records: config, history, summary, the items table, the
artifact, the exit) and checked against the records. Skips where the [wandb] extra is missing (.ci/check_skips.py
expects that in the main environment; .ci/trackers-env.sh runs it where a skip fails CI)."""

import json
import socket
import struct
from pathlib import Path

import pytest

from helpers import SMALL_GRID, run_bench
from pytest_kvbench.results.run.directories import load_run
from pytest_kvbench.wiring.trackers.content import grid_params, item_metrics, items_table

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

wandb = pytest.importorskip("wandb", reason="the [wandb] extra is not installed (No module named 'wandb')")
GRID = [a if a != "full,streamingllm,snapkv" else "full,snapkv" for a in SMALL_GRID]
BLOCK, HEADER = 32768, 7  # the log's blocks and each chunk's header: crc32 (4), length (2), type (1)


def wandb_records(path: Path):
    """The protobuf records of a .wandb file: a 7-byte file header (':W&B', magic, version), then chunks in
    32 KiB blocks (type 1 whole, 2 first, 3 middle, 4 last), as LevelDB's log format lays them out."""
    from wandb.proto import wandb_internal_pb2  # lazy: the [wandb] extra, skipped above when missing

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, pending = 7, b""
    while position + HEADER <= len(data):
        if BLOCK - position % BLOCK < HEADER:  # a block's tail too short for a header is padding
            position += BLOCK - position % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + HEADER])
        chunk = data[position + HEADER:position + HEADER + length]
        position += HEADER + length
        if kind == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def _key(item) -> str:
    return item.key or "/".join(item.nested_key)


@pytest.fixture(scope="module")
def offline_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("wandb")
    results = base / "res"
    proc = run_bench(base / "work", *GRID, "--kvbench-results", str(results), "--kvbench-wandb", "kvbench-tests",
                     env={"WANDB_MODE": "offline", "WANDB_DIR": str(base / "wandb-dir"), "WANDB_SILENT": "true"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    (run_dir,) = (results / "runs").iterdir()
    (offline,) = (base / "wandb-dir" / "wandb").glob("offline-run-*")
    return proc, load_run(run_dir), run_dir, offline


def test_the_offline_run_holds_the_config_every_item_s_history_the_summary_and_the_exit(offline_run):
    proc, run, run_dir, offline = offline_run
    (log,) = offline.glob("run-*.wandb")
    records = list(wandb_records(log))
    (started,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert started.run_id == run.run_id and started.display_name == run.run_id and started.project == "kvbench-tests"
    config = {i.key: json.loads(i.value_json) for i in started.config.update if i.key != "_wandb"}
    settings = json.loads((run_dir / "settings.json").read_text())
    environment = run.info["environment"]
    assert config == grid_params(settings) | {"kvbench.run_id": run.run_id, "kvbench.command": environment["command"]} | (
        {"kvbench.commit": environment["git_commit"], "kvbench.dirty": str(environment["git_dirty"])}
        if environment.get("git_commit") else {})
    history = [{_key(i): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    logged = {}
    for row in history:
        logged.update({k: v for k, v in row.items() if not k.startswith(("_", "items"))})
    expected = {}
    for record in run.records:
        expected |= item_metrics(record, run.run_id)
    assert {k: v for k, v in logged.items() if k != "items_done"} == pytest.approx(expected)
    assert [row["items_done"] for row in history] == list(range(1, len(run.records) + 1))  # one step per item
    summary = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update({_key(i): json.loads(i.value_json) for i in r.summary.update})
    assert summary["kvbench_status"] == "FINISHED"
    assert {k: summary[k] for k in expected} == pytest.approx(expected)  # the last value of each metric
    (exited,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert exited.exit_code == 0
    (artifact,) = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact" and r.artifact.type ==
                   "kvbench-run"]
    assert {entry.path for entry in artifact.manifest.contents} == {"RESULTS.md", "run.json", "report.html"}
    assert f"kvbench: logged to W&B run {run.run_id} (offline run directory {offline})" in proc.stdout


def test_the_items_table_is_the_items_view(offline_run):
    _, run, _, offline = offline_run
    (table_file,) = (offline / "files" / "media" / "table").glob("items_*.table.json")
    table = json.loads(table_file.read_text())
    columns, rows = items_table(run.records, run.run_id)
    assert table["columns"] == columns
    assert [dict(zip(columns, row)) for row in table["data"]] == [dict(zip(columns, row)) for row in rows]


def test_an_unreachable_wandb_server_is_one_line_at_startup(tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = run_bench(tmp_path / "work", *GRID, "--kvbench-results", str(tmp_path / "res"), "--kvbench-wandb", "p",
                     env={"WANDB_MODE": "online", "WANDB_BASE_URL": f"http://127.0.0.1:{port}"})
    assert proc.returncode == 4
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"ERROR: --kvbench-wandb p: the W&B server http://127.0.0.1:{port} does not answer")
    assert "WANDB_MODE=offline" in lines[0] and not (tmp_path / "res").exists()
