"""pytest_kvbench_record_fields, pytest_kvbench_environment and pytest_kvbench_results_columns: a conftest adds
fields of its own to every record before it is written, to the run's environment block, and columns to RESULTS.md.

A user tags results for a tracker (a campaign name, a ticket, the cluster) without patching the harness: the
record hook's fields reach records.jsonl, run.json and the pytest_kvbench_record listeners, and read back typed in
`extra`; the environment hook's reach run.json's environment; the columns hook's, RESULTS.md's tables. One small
run serves the three.
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

