"""Every view names a record from its key: hyphenated method names keep their own rows and folders.

Item ids join their parts with hyphens (``my-a-16-niah_single_1-ctx512``), so cutting an id at
its first hyphen merged the methods ``my-a`` and ``my-b`` into one row ``my`` holding the mean
of both, and wrote both methods' predictions into one folder. Records also say what they ran on.
"""

import json

import pytest
from helpers import HOOK_CONFTEST, hook_records, run_bench

from pytest_kvbench.engine.hardware.device_description import cpu_model
from pytest_kvbench.results.views.table_formats import to_markdown
from pytest_kvbench.results.record import Record
from pytest_kvbench.results.record.schema import SCHEMA_VERSION
from pytest_kvbench.results.views.table_model import score_tables
from pytest_kvbench.results.views.tables import results_markdown

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

HYPHEN_CONFTEST = HOOK_CONFTEST + '''
from dataclasses import dataclass

import torch
from kvmethods import Method, register_method


@register_method
@dataclass
class KeepOldest(Method):
    """Keeps the start of the prompt: the needle's question at the end is lost."""
    name = "my-a"

    def score(self, layer, n_keep):
        return (-torch.arange(layer.seq_len, dtype=torch.float32)).expand(*layer.keys.shape[:2], layer.seq_len)


@register_method
@dataclass
class KeepNewest(Method):
    """Keeps the end of the prompt."""
    name = "my-b"

    def score(self, layer, n_keep):
        return torch.arange(layer.seq_len, dtype=torch.float32).expand(*layer.keys.shape[:2], layer.seq_len)
'''


@pytest.fixture(scope="module")
def hyphen_run(tmp_path_factory):
    work = tmp_path_factory.mktemp("hyphen")
    (work / "conftest.py").write_text(HYPHEN_CONFTEST)
    proc = run_bench(work, "--kvbench-methods", "my-a,my-b", "--kvbench-budgets", "16",
                     "--kvbench-tasks", "niah_single_1", "--kvbench-context-lengths", "512",
                     "--kvbench-samples", "2", "--kvbench-torch-threads", "1", "--kvbench-results", str(work / "res"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work


def test_hyphenated_methods_get_their_own_results_rows(hyphen_run):
    table = (hyphen_run / "res" / "RESULTS.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| my")}
    assert set(rows) == {"my-a", "my-b"}
    by_method = {c["record"]["method"]["name"]: c["record"] for c in hook_records(hyphen_run)}
    for method, line in rows.items():
        mean = line.split("|")[2].strip().split(" ± ")[0]  # then the 95% half-width over its 2 samples
        assert f"{by_method[method]['score']:.2f}" == mean


def test_hyphenated_methods_get_their_own_prediction_folders(hyphen_run):
    run_dir = next((hyphen_run / "res" / "runs").iterdir())
    folders = sorted(p.name for p in run_dir.iterdir() if p.is_dir())
    assert folders == ["my-a_default_16", "my-b_default_16"]
    by_method = {c["record"]["method"]["name"]: c["record"] for c in hook_records(hyphen_run)}
    for method in ("my-a", "my-b"):
        lines = (run_dir / f"{method}_default_16" / "niah_single_1_512" / "predictions.jsonl").read_text().splitlines()
        assert [json.loads(line)["prediction"] for line in lines] == [s["prediction"] for s in by_method[method]["samples"]]


def test_records_carry_the_device_they_ran_on(hyphen_run):
    for call in hook_records(hyphen_run):
        assert call["record"]["schema_version"] == SCHEMA_VERSION  # the hook gets the record's JSON form
        device = call["record"]["device"]
        assert device["type"] == "cpu"
        assert device["name"] == device["cpu_model"] == cpu_model()
        assert device["threads"] == 1  # --kvbench-torch-threads, which CPU timings depend on


def _record(method: str, score: float) -> Record:
    return Record.from_json({"key": f"default|{method}|16|trec|seed0", "item_id": f"{method}-16-trec", "status": "passed",
                             "score": score, "model": {"name": "default"}, "method": {"name": method, "params": {}},
                             "budget": {"spec": "16"}, "task": {"name": "trec"}, "seed": 0, "samples": []})


def test_every_view_labels_rows_from_the_key_not_the_item_id():
    """The issue's numbers: my-a scores 10 and my-b 50; RESULTS.md showed one row ``my`` at 30."""
    records = [_record("my-a", 10.0), _record("my-b", 50.0)]
    (table,) = score_tables(records)
    assert table.methods == ["my-a", "my-b"]
    assert (table.value("my-a", "trec"), table.value("my-b", "trec")) == (10.0, 50.0)
    for markdown in (results_markdown({"run_id": "r"}, records), to_markdown(records)):
        rows = {line.split("|")[1].strip(): line.split("|")[2].strip(" *") for line in markdown.splitlines()
                if line.startswith("| my")}
        assert rows == {"my-a": "10.00", "my-b": "50.00"}
