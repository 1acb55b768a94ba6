"""Collection: the grid becomes stable, selectable item ids, and bad input is a usage error."""

import shutil

import pytest

from helpers import SMALL_GRID, collected_ids
from pytest_kvbench.engine.models import DEFAULT_MODEL_DIR

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


def test_item_ids_are_readable_and_stable(bench):
    result = bench.runpytest("--collect-only", "-q", *SMALL_GRID)
    assert result.ret == 0
    assert sorted(collected_ids(result)) == sorted([
        "full-passage_retrieval_en",
        "streamingllm-32-passage_retrieval_en",
        "snapkv-32-passage_retrieval_en",
        "full-niah_single_1-ctx256",
        "streamingllm-32-niah_single_1-ctx256",
        "snapkv-32-niah_single_1-ctx256",
    ])


def test_k_selects_exactly_the_matching_items(bench):
    result = bench.runpytest("--collect-only", "-q", *SMALL_GRID, "-k", "snapkv and passage_retrieval_en")
    assert collected_ids(result) == ["snapkv-32-passage_retrieval_en"]


def test_method_parameters_budget_ratio_seeds_and_models_appear_in_ids(bench, tmp_path):
    model_dir = tmp_path / "m2"
    shutil.copytree(DEFAULT_MODEL_DIR, model_dir)  # a whole model: config, weights, tokenizer
    args = ["--collect-only", "-q", "-p", "no:cacheprovider", "--kvbench-methods", "snapkv:window=8",
            "--kvbench-budgets", "r0.5", "--kvbench-tasks", "passage_retrieval_en", "--kvbench-seeds", "0,1",
            "--kvbench-model", "default", "--kvbench-model", str(model_dir)]
    ids = collected_ids(bench.runpytest(*args))
    assert "snapkv(window=8)-r0.5-passage_retrieval_en-seed1-m2" in ids
    assert len(ids) == 4


def test_markers_are_registered_and_smoke_is_a_subset(bench):
    everything = collected_ids(bench.runpytest("--collect-only", "-q", *SMALL_GRID))
    smoke = collected_ids(bench.runpytest("--collect-only", "-q", *SMALL_GRID, "-m", "smoke"))
    assert set(smoke) <= set(everything)
    ruler = collected_ids(bench.runpytest("--collect-only", "-q", *SMALL_GRID, "-m", "ruler"))
    assert ruler and all("niah" in i for i in ruler)
    markers = bench.runpytest("--markers").stdout.str()
    for name in ("smoke", "longbench", "ruler", "slow"):
        assert f"@pytest.mark.{name}:" in markers


def test_toml_grid_file_and_command_line_precedence(bench):
    bench.makefile(".toml", grid='methods = ["full", {name = "snapkv", window = 16}]\n'
                                 'budgets = [64]\ntasks = ["passage_retrieval_en"]\nsamples = 3\n')
    ids = collected_ids(bench.runpytest("--collect-only", "-q", "--kvbench-config", "grid.toml"))
    assert sorted(ids) == ["full-passage_retrieval_en", "snapkv(window=16)-64-passage_retrieval_en"]
    ids = collected_ids(bench.runpytest("--collect-only", "-q", "--kvbench-config", "grid.toml", "--kvbench-budgets", "8"))
    assert "snapkv(window=16)-8-passage_retrieval_en" in ids


def test_ini_keys_configure_the_grid(bench):
    bench.makeini("[pytest]\nkvbench_methods = streamingllm\nkvbench_budgets = 48\nkvbench_tasks = passage_retrieval_en\n")
    assert collected_ids(bench.runpytest("--collect-only", "-q")) == ["streamingllm-48-passage_retrieval_en"]


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--kvbench-methods", "snapk"], "unknown method 'snapk'"),
        (["--kvbench-tasks", "qaspr"], "qaspr"),
        (["--kvbench-budgets", "0"], "budget"),
        (["--kvbench-budgets", "-5"], "budget"),
        (["--kvbench-budgets", "lots"], "budget"),
        (["--kvbench-samples", "0"], "--kvbench-samples must be a positive integer"),
        (["--kvbench-samples", "2.5"], "--kvbench-samples must be a positive integer"),
        (["--kvbench-model", "./no/such/model"], "model path ./no/such/model: not found"),
        (["--kvbench-methods", "snapkv:windw=3"], "windw"),
        (["--kvbench-protocol", "sideways"], "unknown protocol"),
        (["--kvbench-timeout", "-1"], "--kvbench-timeout must be a positive number"),
        (["--kvbench-torch-threads", "two"], "--kvbench-torch-threads must be a positive integer"),
        (["--kvbench-shard", "4/3"], "--kvbench-shard"),
    ],
)
def test_bad_input_is_a_one_line_usage_error(bench, args, fragment):
    result = bench.runpytest("--collect-only", *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert fragment in err
    assert "Traceback" not in err + result.stdout.str()
    assert len([line for line in err.splitlines() if line.startswith("ERROR")]) == 1


def test_malformed_grid_file_is_a_usage_error(bench):
    bench.makefile(".toml", grid="methods = [\n")
    result = bench.runpytest("--collect-only", "--kvbench-config", "grid.toml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "grid.toml: malformed TOML" in result.stderr.str()
    bench.makefile(".toml", grid2='method = ["full"]\n')
    result = bench.runpytest("--collect-only", "--kvbench-config", "grid2.toml")
    assert "unknown key(s) method" in result.stderr.str()


def test_the_default_grid_runs_its_quantizer_at_a_byte_budget(bench):
    """kivi keeps every token whatever the token budget, so the default budgets (128, 256) give it the byte budget
    m0.125: one kivi item per task, in the smoke subset (the gate covers the quantization family); a budget given
    applies to every method, kivi included."""
    smoke = collected_ids(bench.runpytest("--collect-only", "-q", "-m", "smoke"))
    assert [i for i in smoke if i.startswith("kivi")] == [f"kivi-m0.125-{task}" for task in
                                                           ["passkey", "lcc", "longbench_v2", "aime2024:max_new_tokens=64",
                                                            "niah_single_1-ctx2048", "scbench_vt"]]
    assert not any(i.startswith("kivi") for i in smoke if "m0.125" not in i)
    assert not any("m0.125" in i for i in smoke if not i.startswith("kivi"))
    chosen = ["--kvbench-tasks", "passage_retrieval_en"]
    ids = collected_ids(bench.runpytest("--collect-only", "-q", "--kvbench-methods", "snapkv,kivi", *chosen))
    assert ids == ["snapkv-128-passage_retrieval_en", "snapkv-256-passage_retrieval_en",
                   "kivi-m0.125-passage_retrieval_en"]
    ids = collected_ids(bench.runpytest("--collect-only", "-q", "--kvbench-methods", "snapkv,kivi",
                                        "--kvbench-budgets", "128", *chosen))
    assert ids == ["snapkv-128-passage_retrieval_en", "kivi-128-passage_retrieval_en"]
