"""pytest_kvbench_record_fields, pytest_kvbench_environment, pytest_kvbench_results_columns and
pytest_kvbench_item_id: a conftest adds fields of its own to every record before it is written, to the run's
environment block, columns to RESULTS.md, and renames the items' pytest ids.

A user tags results for a tracker (a campaign name, a ticket, the cluster) without patching the harness: the
record hook's fields reach records.jsonl, run.json and the pytest_kvbench_record listeners, and read back typed in
`extra`; the environment hook's reach run.json's environment; the columns hook's, RESULTS.md's tables. One small
run serves the three. A renamed id is what pytest shows, `-k` matches and the record's `item_id` says, while the
record's key stays the harness's own: a baseline saved under the default ids still judges the renamed items.
"""

import json

import pytest
from helpers import add_bench_files

from pytest_kvbench.results.record import Record

CONFTEST = '''
import json

def pytest_kvbench_environment(environment, config):
    return {"cluster": "lab-a", "commit_seen": environment["git_commit"]}

def pytest_kvbench_results_columns(config):
    return {"Samples": lambda records: sum(len(r.samples) for r in records), "Never": lambda records: None}

def pytest_kvbench_record_fields(record, item):
    return {"campaign": "nightly", "method_seen": record["method"]["name"]}

def pytest_kvbench_record(record, item):
    with open("hook_calls.jsonl", "a") as f:
        f.write(json.dumps(record) + "\\n")
'''
GRID = ["--kvbench-methods", "full,streamingllm", "--kvbench-budgets", "32", "--kvbench-tasks", "niah_single_1",
        "--kvbench-context-lengths", "256", "--kvbench-samples", "1", "--kvbench-max-prompt-tokens", "320",
        "-p", "no:cacheprovider", "-q"]


def test_the_hooks_fields_reach_records_environment_and_results_md(pytester):
    add_bench_files(pytester)
    pytester.makeconftest(CONFTEST)
    result = pytester.runpytest_subprocess(*GRID, "--kvbench-results", "res", timeout=900)
    assert result.ret == 0, result.stdout.str()[-3000:]
    (run,) = (pytester.path / "res" / "runs").iterdir()
    written = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    heard = [json.loads(line) for line in (pytester.path / "hook_calls.jsonl").read_text().splitlines()]
    assert len(written) == len(heard) == 2
    run_json = json.loads((run / "run.json").read_text())
    environment = run_json["environment"]
    assert environment["cluster"] == "lab-a" and environment["commit_seen"] == environment["git_commit"]
    lines = (run / "RESULTS.md").read_text().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("| Method"))
    header, rows = lines[first], lines[first + 2: first + 4]  # the table of the one budget: full, streamingllm

    def last_two(line):
        return [cell.strip() for cell in line.strip("|").split("|")][-2:]

    assert last_two(header) == ["Samples", "Never"] and [last_two(row) for row in rows] == [["1", "-"]] * 2
    for record in written + heard + run_json["records"]:
        assert record["campaign"] == "nightly" and record["method_seen"] == record["method"]["name"]
        assert Record.from_json(record).extra == {"campaign": "nightly", "method_seen": record["method"]["name"]}


def test_a_column_named_like_one_of_the_tables_is_a_usage_error(pytester):
    add_bench_files(pytester)
    pytester.makeconftest("def pytest_kvbench_results_columns(config):\n    return {'KL': len}\n")
    result = pytester.runpytest_subprocess(*GRID, "--collect-only", "--kvbench-results", "res")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "pytest_kvbench_results_columns: 'KL': RESULTS.md's tables have that column already" in result.stderr.str()



ITEM_ID_CONFTEST = """
def pytest_kvbench_item_id(case, default, config):
    if case.is_reference:
        return None
    return f"{case.method.label}-{case.budget.spec}-nightly"
"""


def test_the_item_id_hook_renames_the_pytest_id_and_keeps_the_key(pytester):
    """Run 1 saves a baseline under the default ids; run 2 renames the compressed item, selects it by its new id
    with -k, and the gate finds its baseline entry by the unchanged key."""
    add_bench_files(pytester)
    saved = pytester.runpytest_subprocess(*GRID, "--kvbench-results", "res1", "--kvbench-save", "base.json",
                                          timeout=900)
    assert saved.ret == 0, saved.stdout.str()[-3000:]
    pytester.makeconftest(ITEM_ID_CONFTEST)
    collected = pytester.runpytest_subprocess(*GRID, "--collect-only", "--kvbench-results", "res2")
    assert "test_suite_ruler.py::test_ruler[streamingllm-32-nightly]" in collected.stdout.str()
    assert "test_suite_ruler.py::test_ruler[full-niah_single_1-ctx256]" in collected.stdout.str()  # None: default
    result = pytester.runpytest_subprocess(*GRID, "--kvbench-results", "res2", "--kvbench-compare", "base.json",
                                           "-k", "nightly", timeout=900)
    assert result.ret == 0, result.stdout.str()[-3000:]
    [before], [after] = ([json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()
                          if json.loads(line)["method"]["name"] == "streamingllm"]
                         for run in (next((pytester.path / res / "runs").iterdir()) for res in ("res1", "res2")))
    assert before["item_id"] == "streamingllm-32-niah_single_1-ctx256" and after["item_id"] == "streamingllm-32-nightly"
    assert after["nodeid"].endswith("[streamingllm-32-nightly]") and after["key"] == before["key"]
    assert after["verdict"]["status"] == "ok"  # judged against the entry saved under the default id
    (run2,) = (pytester.path / "res2" / "runs").iterdir()
    assert [r["item_id"] for r in json.loads((run2 / "run.json").read_text())["records"]] == ["streamingllm-32-nightly"]


@pytest.mark.parametrize("answer, why", [
    ("'same'", "'same' names two items (default|full|full|niah_single_1@256|seed0 and "
               "default|streamingllm|32|niah_single_1@256|seed0); return a different id for each"),
    ("'a[1]'", "'a[1]' for default|full|full|niah_single_1@256|seed0 is not an item id: return a non-empty string "
               "of printable ASCII without '[', ']' or '::'"),
])
def test_an_item_id_that_two_items_share_or_a_node_id_cannot_hold_is_a_usage_error(pytester, answer, why):
    add_bench_files(pytester)
    pytester.makeconftest(f"def pytest_kvbench_item_id(case, default, config):\n    return {answer}\n")
    result = pytester.runpytest_subprocess(*GRID, "--collect-only", "--kvbench-results", "res")
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-3000:]
    assert f"pytest_kvbench_item_id: {why}" in result.stderr.str() + result.stdout.str()


def test_renamed_items_under_xdist_are_scheduled_expected_and_finished(pytester):
    """Under -n 2 --dist loadgroup the controller maps the workers' node ids to cases by the renamed ids (expected
    items, the scheduler's groups, the progress board): the run finishes every item, none is left unfinished."""
    add_bench_files(pytester)
    pytester.makeconftest(ITEM_ID_CONFTEST)
    result = pytester.runpytest_subprocess(*GRID, "-p", "xdist", "-n", "2", "--dist", "loadgroup",
                                           "--kvbench-torch-threads", "1", "--kvbench-results", "res", timeout=900)
    assert result.ret == 0, result.stdout.str()[-3000:]
    (run,) = (pytester.path / "res" / "runs").iterdir()
    run_json = json.loads((run / "run.json").read_text())
    assert run_json["complete"] and not run_json.get("unfinished")
    assert sorted(i["item_id"] for i in run_json["expected"]) == ["full-niah_single_1-ctx256", "streamingllm-32-nightly"]
    assert sorted(r["item_id"] for r in run_json["records"]) == ["full-niah_single_1-ctx256", "streamingllm-32-nightly"]
