"""Protocols in the grid: in item ids, keys and table titles; several per grid; tasks that cannot serve
one are a usage error; `kvbench compare` refuses runs of different protocols; a real run records scores
per context and per turn."""

import json

import pytest
from test_cli_support import OTHER_ID, RUN_ID, assert_usage_error, make_record, run_cli, typed, write_run

from helpers import BENCH, SMALL_GRID, collected_ids, hook_records, run_bench
from pytest_kvbench.results.report.html_report import build_report
from pytest_kvbench.results.run.directories import load_run
from pytest_kvbench.results.views.table_model import score_tables


def test_a_grid_holds_several_protocols_named_in_the_item_ids(bench):
    result = bench.runpytest("--collect-only", "-q", *SMALL_GRID, "--kvbench-protocol",
                             "question_in_window,shared_context")
    ids = collected_ids(result)
    assert "snapkv-32-passage_retrieval_en" in ids and "snapkv-32-passage_retrieval_en-shared_context" in ids
    assert len(ids) == 12


def test_multi_turn_on_a_named_task_without_turns_is_a_one_line_usage_error(bench):
    result = bench.runpytest("--collect-only", "-q", *SMALL_GRID, "--kvbench-protocol", "multi_turn")
    assert result.ret == 4
    errors = [line for line in result.errlines if "ERROR" in line]
    assert len(errors) == 1 and "cannot run under protocol multi_turn" in errors[0]


def test_an_unknown_protocol_is_a_usage_error(bench):
    result = bench.runpytest("--collect-only", "-q", *SMALL_GRID, "--kvbench-protocol", "sharedcontext")
    assert result.ret == 4
    assert "unknown protocol 'sharedcontext'" in result.stderr.str()


def test_multi_turn_leaves_default_tasks_without_turns_out(bench):
    ids = collected_ids(bench.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "--kvbench-methods",
                                        "full", "--kvbench-protocol", "multi_turn"))
    assert ids and all("scbench" in i and i.endswith("-multi_turn") for i in ids)


def test_the_protocol_is_in_the_key_labels_and_table_title():
    default = typed(make_record([1, 0]))
    shared = make_record([1, 1], protocol="shared_context")
    shared = typed(shared | {"key": shared["key"] + "|protocol=shared_context"})
    assert shared.labels.protocol == "shared_context" and shared.labels.task == default.labels.task
    assert default.labels.protocol == "question_in_window"
    headings = sorted(table.heading for table in score_tables([default, shared]))
    assert headings == ["default — budget 128", "default — budget 128 — protocol shared_context"]


def test_kvbench_compare_refuses_runs_of_different_protocols(capsys, tmp_path):
    write_run(tmp_path, [make_record([1, 0, 1])])
    write_run(tmp_path, [make_record([1, 0, 1], protocol="shared_context")], run_id=OTHER_ID)
    code, _, err = run_cli(capsys, "compare", RUN_ID, OTHER_ID, "--results", tmp_path)
    assert_usage_error(code, err, "cannot compare across protocols", "shared_context")


@pytest.fixture(scope="module")
def grouped_run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("grouped")
    (directory / "test_scbench.py").write_text((BENCH / "test_scbench.py").read_text())
    result = run_bench(directory, "--kvbench-methods", "full,snapkv", "--kvbench-budgets", "64",
                       "--kvbench-tasks", "scbench_kv", "--kvbench-samples", "3", "--kvbench-torch-threads", "1",
                       "--kvbench-protocol", "shared_context,multi_turn,query_agnostic", "test_scbench.py")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return directory, {r["record"]["item_id"]: r["record"] for r in hook_records(directory)}


def test_a_grouped_run_scores_per_context_and_per_turn(grouped_run):
    directory, records = grouped_run
    assert set(records) == {f"{item}-{protocol}" for item in ("full-scbench_kv", "snapkv-64-scbench_kv")
                            for protocol in ("shared_context", "multi_turn", "query_agnostic")}
    turns = records["snapkv-64-scbench_kv-multi_turn"]
    assert [(s["context"], s["turn"]) for s in turns["samples"]] == [(0, 0), (0, 1), (0, 2)]
    prompts = [s["prompt_tokens"] for s in turns["samples"]]
    assert prompts[0] < prompts[1] < prompts[2]  # earlier turns stay in the cache
    assert set(turns["aggregate"]["turns"]) == {"1", "2", "3"} and turns["protocol"] == "multi_turn"
    assert turns["task"]["history"] == "gold"
    for item in ("full-scbench_kv", "snapkv-64-scbench_kv"):
        # SCBench with gold history: the context compressed once, each turn's history and question kept whole,
        # whether the turns share one cache (multi_turn) or each prompt is run alone (query_agnostic)
        conversation, alone = records[f"{item}-multi_turn"]["samples"], records[f"{item}-query_agnostic"]["samples"]
        assert [s["prediction"] for s in conversation] == [s["prediction"] for s in alone]
        assert [s["prompt_tokens"] for s in conversation] == [s["prompt_tokens"] for s in alone]
    shared = records["snapkv-64-scbench_kv-shared_context"]
    assert shared["aggregate"]["contexts"] == {"0": shared["score"]}
    for protocol in ("shared_context", "multi_turn"):  # fidelity against full under the same protocol
        full, snapkv = records[f"full-scbench_kv-{protocol}"], records[f"snapkv-64-scbench_kv-{protocol}"]
        assert full["fidelity"] == {"kl": 0.0, "agreement": 1.0, "decode_kl": 0.0}
        assert all(s["kl"] >= 0.0 and 0.0 <= s["agreement"] <= 1.0 for s in snapkv["samples"])
        assert snapkv["fidelity"]["kl"] > 0.0  # 64 of a few hundred context tokens: the distributions move
    results = (directory / "results" / "RESULTS.md").read_text()
    assert "protocol multi_turn — SCBench scbench_kv by turn (gold history)" in results
    assert "| Turn 3" in results and "Pooled" in results
    assert "budget 64 — protocol shared_context" in results
    runs = sorted((directory / "results" / "runs").iterdir())
    page = build_report([load_run(runs[-1])])
    assert "<h4>SCBench scbench_kv by turn (gold history)</h4>" in page and "Turn 3" in page


def test_the_model_own_history_is_refused_outside_multi_turn(bench):
    result = bench.runpytest("--collect-only", "-q", "--kvbench-methods", "full", "--kvbench-tasks",
                             "scbench_kv:history=model", "--kvbench-protocol", "multi_turn,shared_context")
    assert result.ret == 4
    errors = [line for line in result.errlines if "ERROR" in line]
    assert len(errors) == 1 and "cannot run under protocol shared_context: history=model" in errors[0]
    ids = collected_ids(bench.runpytest("--collect-only", "-q", "--kvbench-methods", "full", "--kvbench-tasks",
                                        "scbench_kv:history=model", "--kvbench-protocol", "multi_turn"))
    assert ids == ["full-scbench_kv:history=model-multi_turn"]


@pytest.mark.parametrize("method, message", [
    ("decoding:interval=0", "'interval' must be >= 1"),
    ("decoding:base=snapkv:interval=64", "interval 64 exceeds the 32 tokens passage_retrieval_en generates"),
])
def test_a_decoding_interval_of_zero_or_beyond_the_generation_is_a_usage_error(bench, method, message):
    result = bench.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "--kvbench-methods", method,
                             "--kvbench-tasks", "passage_retrieval_en")
    assert result.ret == 4
    errors = [line for line in result.errlines if "ERROR" in line]
    assert len(errors) == 1 and message in errors[0], result.errlines


def test_a_decoding_method_runs_on_a_summarization_task_at_its_official_length(tmp_path):
    """gov_report may generate 512 tokens (LongBench's official length); the item runs, records the cache
    length of every decoding step within budget + interval. (The embedded model ends its summaries early;
    the bound over long generations is tested on tiny models in test_protocols.py.)"""
    result = run_bench(tmp_path, "--kvbench-methods", "decoding:base=snapkv:interval=64,snapkv",
                       "--kvbench-budgets", "128", "--kvbench-tasks", "gov_report", "--kvbench-samples", "1",
                       "--kvbench-torch-threads", "1", "test_longbench.py")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = {r["record"]["method"]["name"]: r["record"] for r in hook_records(tmp_path)}
    assert records["decoding"]["method"]["params"]["interval"] == 64
    assert records["decoding"]["task"]["name"] == "gov_report" and records["decoding"]["status"] == "passed"
    sample = records["decoding"]["samples"][0]
    lengths = sample.get("decode_cache_lengths", [])
    assert len(lengths) == max(0, sample["new_tokens"] - 1) and all(n <= 128 + 64 for n in lengths)
    assert "decode_cache_lengths" not in records["snapkv"]["samples"][0]


# -- RULER: several questions per haystack (the shared_context protocol's groups) -----------------------------

def test_ruler_niah_puts_several_questions_on_one_haystack():
    from test_tasks_support import tiny_tokenizer

    from pytest_kvbench.engine.protocol_runs import context_groups
    from pytest_kvbench.tasks import get_task

    tokenizer = tiny_tokenizer()
    task = get_task("niah_single_1:questions=3")
    samples = task.load_samples(tokenizer, n=6, seed=0, data_dir="fixtures", context_length=512)
    prompts = [task.build_prompt(sample, tokenizer, None) for sample in samples]
    assert context_groups(samples, prompts) == [[0, 1, 2], [3, 4, 5]]
    first = samples[:3]
    assert len({s.answers[0] for s in first}) == 3  # each question asks its own needle
    assert all(s.answers[0] in s.fields["input"] for s in first)  # ... hidden in the shared haystack
    single = get_task("niah_single_1").load_samples(tokenizer, n=2, seed=0, data_dir="fixtures", context_length=512)
    assert len({tuple(p.input_ids[: p.context_len]) for p in
                (get_task("niah_single_1").build_prompt(s, tokenizer, None) for s in single)}) == 2


@pytest.mark.parametrize("task, message", [("cwe:questions=2", "needs a niah, vt or qa task"),
                                           ("passkey:questions=2", "takes no questions setting")])
def test_questions_on_a_task_without_a_haystack_of_needles_is_a_usage_error(bench, task, message):
    result = bench.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "--kvbench-methods", "full",
                             "--kvbench-tasks", task)
    assert result.ret == 4 and message in result.stderr.str()


def test_per_turn_runs_under_multi_turn_on_ruler_questions_and_starts_each_turn_from_the_budget(tmp_path):
    (tmp_path / "test_ruler.py").write_text((BENCH / "test_ruler.py").read_text())
    result = run_bench(tmp_path, "--kvbench-methods", "full,snapkv:per_turn=true", "--kvbench-budgets", "64",
                       "--kvbench-tasks", "niah_single_1:questions=2", "--kvbench-samples", "2",
                       "--kvbench-context-lengths", "512", "--kvbench-torch-threads", "1",
                       "--kvbench-protocol", "multi_turn", "test_ruler.py")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = {r["record"]["method"]["name"]: r["record"] for r in hook_records(tmp_path)}
    per_turn = records["snapkv"]
    assert per_turn["method"]["params"]["per_turn"] is True and "snapkv(per_turn=True)" in per_turn["key"]
    first, second = per_turn["samples"]
    question = second["prompt_tokens"] - first["prompt_tokens"] - first["new_tokens"]
    assert second["kept_tokens"] in (64 + question, 64 + 1 + question)  # + the last answer token if not fed
    assert per_turn["fidelity"]["kl"] is not None


def test_per_turn_under_a_protocol_without_turns_is_a_one_line_usage_error(bench):
    result = bench.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "--kvbench-methods",
                             "snapkv:per_turn=true", "--kvbench-tasks", "niah_single_1:questions=2",
                             "--kvbench-protocol", "multi_turn,shared_context")
    assert result.ret == 4
    errors = [line for line in result.errlines if "ERROR" in line]
    assert len(errors) == 1 and "per_turn re-compresses after each turn" in errors[0], result.errlines
