"""Malformed input of every class in issue 21 is a one-line error before any work starts: the pytest side.

Hypothesis drives pytest options, ini keys and TOML grid keys with malformed values: paths the OS refuses
(names over the length limit, NUL bytes, a file where a directory belongs and the reverse), hub ids the hub
rejects, values of the wrong TOML type, non-finite and non-positive numbers, empty lists, unknown names, runs
outside the results directory and empty baselines. Every one must end pytest with exit code 4, print exactly
one line, show no traceback and write nothing outside the results directory. pytest runs in this process and
the pytester directory holds no test file, so no model can load. The `kvbench` command's side:
test_kvbench_bad_input.py; values dropped, contradictions and unbounded numbers (issue 31): test_grid_refusals.py.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from bad_input_helpers import FAST, assert_one_line_usage_error, unusable_paths, workdir  # noqa: F401 - a fixture

# -- malformed values, by class ---------------------------------------------------------------

bad_hub_ids = st.sampled_from(["模型/x", "-bad-/x", "org/-x", "a" * 97 + "/b", "org/x..y", "org/ x"])
# values that no positive-integer option may accept
bad_counts = (st.sampled_from(["0", "-1", "nan", "inf", "-inf", "1e999", "2.5", "abc", "0x10", "1_0"])
              | st.integers(max_value=0).map(str))
huge = st.integers(min_value=2**32, max_value=2**80).map(str)
bad_durations = st.sampled_from(["0", "-1", "nan", "NaN", "inf", "-inf", "1e999", "abc", "-0.0"])
empty_lists = st.sampled_from(["", ",", " , ", ",,"])
unknown_names = st.text(alphabet="qxz", min_size=1, max_size=12)

PATH_OPTIONS = ["--kvbench-compare", "--kvbench-save", "--kvbench-config", "--kvbench-model",
                "--kvbench-data", "--kvbench-results", "--kvbench-resume"]
# a path of the wrong kind for each path option ("." is a directory, a_file.txt a file)
WRONG_KIND = {"--kvbench-compare": ".", "--kvbench-save": ".", "--kvbench-config": ".",
              "--kvbench-model": "a_file.txt", "--kvbench-data": "a_file.txt",
              "--kvbench-results": "a_file.txt", "--kvbench-resume": "."}
COUNT_OPTIONS = ["--kvbench-samples", "--kvbench-max-prompt-tokens", "--kvbench-context-lengths",
                 "--kvbench-torch-threads"]
LIST_OPTIONS = ["--kvbench-model", "--kvbench-methods", "--kvbench-budgets", "--kvbench-tasks",
                "--kvbench-seeds", "--kvbench-context-lengths"]
NAME_OPTIONS = ["--kvbench-methods", "--kvbench-tasks", "--kvbench-protocol", "--kvbench-dtype",
                "--kvbench-attn-implementation", "--kvbench-preset"]


@st.composite
def bad_options(draw) -> list[str]:
    """One malformed option of any class, as command-line arguments."""
    kind = draw(st.sampled_from(["path", "wrong kind", "hub id", "count", "out of range", "duration", "empty", "name",
                                 "duplicate tolerance", "context too small", "against a preset"]))
    if kind == "path":
        return [draw(st.sampled_from(PATH_OPTIONS)), draw(unusable_paths)]
    if kind == "wrong kind":
        option = draw(st.sampled_from(PATH_OPTIONS))
        return [option, WRONG_KIND[option]]
    if kind == "hub id":
        return ["--kvbench-model", draw(bad_hub_ids)]
    if kind == "count":
        return [draw(st.sampled_from(COUNT_OPTIONS)), draw(bad_counts)]
    if kind == "out of range":
        return [draw(st.sampled_from(["--kvbench-seed", "--kvbench-seeds", "--kvbench-torch-threads"])),
                draw(huge | st.sampled_from(["-1", "-7"]))]
    if kind == "duration":
        return ["--kvbench-timeout", draw(bad_durations)]
    if kind == "empty":
        return [draw(st.sampled_from(LIST_OPTIONS + ["--kvbench-data", "--kvbench-dtype",
                                                     "--kvbench-max-prompt-tokens"])), draw(empty_lists)]
    if kind == "name":
        return [draw(st.sampled_from(NAME_OPTIONS)), draw(unknown_names)]
    if kind == "duplicate tolerance":
        return ["--kvbench-compare-fail", "score:1,score:2"]
    if kind == "against a preset":
        return ["--kvbench-preset", "kvpress-leaderboard", "--kvbench-context-lengths",
                str(draw(st.integers(129, 16384).filter(lambda n: n != 4096)))]
    return ["--kvbench-tasks", "niah_single_1", "--kvbench-context-lengths", str(draw(st.integers(1, 128)))]


TOML_CASES = st.sampled_from([
    "kvbench = 3", 'kvbench = "x"', "kvbench = [1]",
    "samples = [1]", "samples = {a = 1}", "samples = true", "samples = 1.5", "samples = 0", "samples = -3",
    "max_prompt_tokens = 0", "max_prompt_tokens = [320]", "seed = -1", "seed = 1.0",
    "models = 3", "models = []", "models = [[1]]", 'models = [""]', 'models = ["模型/x"]',
    "budgets = []", "budgets = [{a = 1}]", "budgets = 1.5", 'budgets = ["0128", "0"]',
    "methods = [{window = 3}]", "methods = [1.5]", "methods = []", 'methods = [{name = "snapkv", window = "nan"}]',
    "tasks = []", 'tasks = ["qaspr"]', "context_lengths = [0]", "context_lengths = []",
    "protocol = 3", 'protocol = ""', 'dtype = "float64"', 'attn_implementation = "fast"',
    'data = "a_file.txt"', "data = 1", "unknown_key = 1", "[kvbench]\nsamples = 0",
    'models = ["' + "m" * 300 + '"]', 'data = "a\\u0000b"',
    'preset = "kvpress"', "preset = 3", 'preset = ""', "preset = [1]",
])

INI_CASES = st.sampled_from([
    "kvbench_budgets = ,", "kvbench_methods =", "kvbench_model = ,", "kvbench_samples = 0",
    "kvbench_samples = nan", "kvbench_tasks = qaspr", "kvbench_protocol = sideways",
    "kvbench_max_prompt_tokens = 0", "kvbench_max_prompt_tokens =", "kvbench_results = a_file.txt",
    "kvbench_results = " + "r" * 300, "kvbench_context_lengths = 0", "kvbench_dtype =",
    "kvbench_attn_implementation = fastest", "kvbench_seeds = ,", "kvbench_seed = -2",
    "kvbench_progress_interval = soon", "kvbench_progress_interval = -1",
])

PYPROJECT_CASES = st.sampled_from([
    "[tool.pytest.ini_options]\nkvbench_samples = \"0\"", "[tool.pytest.ini_options]\nkvbench_budgets = []",
    '[tool.pytest.ini_options]\nkvbench_results = "a_file.txt"', "[tool.pytest]\nkvbench_samples = 5",
    "[tool.pytest]\nkvbench_budgets = [128]", '[tool.pytest]\nkvbench_seed = "-1"',
    '[tool.pytest]\nkvbench_max_prompt_tokens = "0"', '[tool.pytest]\nkvbench_model = ["模型/x"]',
    '[tool.pytest]\nkvbench_progress_interval = "-5"', "[tool.pytest]\nkvbench_progress_interval = 5",
])


# -- the pytest side --------------------------------------------------------------------------


@FAST
@given(args=bad_options())
def test_malformed_options_are_one_line_usage_errors(workdir, args):
    # --option=value: a value starting with '-' would otherwise be read by argparse as an option
    joined = [f"{args[i]}={args[i + 1]}" for i in range(0, len(args), 2)]
    assert_one_line_usage_error(workdir, *joined)


@FAST
@given(case=TOML_CASES)
def test_malformed_toml_grid_files_are_one_line_usage_errors(workdir, case):
    (workdir.path / "grid.toml").write_text(case + "\n", encoding="utf-8")
    assert_one_line_usage_error(workdir, "--kvbench-config", "grid.toml")


@FAST
@given(case=INI_CASES)
def test_malformed_ini_keys_are_one_line_usage_errors(workdir, case):
    workdir.makeini("[pytest]\n" + case + "\n")
    assert_one_line_usage_error(workdir)


@FAST
@given(case=PYPROJECT_CASES)
def test_malformed_pyproject_ini_keys_are_one_line_usage_errors(workdir, case):
    (workdir.path / "pyproject.toml").write_text(case + "\n", encoding="utf-8")
    try:
        assert_one_line_usage_error(workdir)
    finally:
        (workdir.path / "pyproject.toml").unlink()


def test_a_baseline_with_no_entries_is_refused_before_the_run(workdir):
    (workdir.path / "empty.json").write_text(json.dumps({"format": "kvbench-baseline", "version": 1, "entries": {}}))
    message = assert_one_line_usage_error(workdir, "--kvbench-compare", "empty.json")
    assert "has no entries" in message


def test_a_corrupt_model_config_is_refused_before_the_run(workdir):
    model = workdir.path / "broken_model"
    model.mkdir()
    for text in ("{", "[]", '{"model_type": "no_such_architecture"}'):
        (model / "config.json").write_text(text)
        message = assert_one_line_usage_error(workdir, "--kvbench-model", str(model))
        assert "config.json cannot be read" in message


@pytest.mark.parametrize("value", ["0", "-1", "1025", "2.5", "Auto2", "١", "", "99999999999999999999999"])
def test_a_decode_batch_that_is_not_auto_or_a_whole_number_in_range_is_one_line(workdir, value):
    line = assert_one_line_usage_error(workdir, f"--kvbench-decode-batch={value}")
    assert "--kvbench-decode-batch" in line


def test_a_bad_decode_batch_ini_key_is_one_line(workdir):
    workdir.makeini("[pytest]\nkvbench_decode_batch = lots\n")
    line = assert_one_line_usage_error(workdir)
    assert "ini key kvbench_decode_batch must be 'auto' or a whole number from 1 to 1,024" in line
