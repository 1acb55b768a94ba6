"""Issue 31: values dropped, contradictions, unbounded numbers and non-ASCII digits are refused in one line,
and any value of these classes is a grid or a one-line usage error.

Checked in process on the parsed configuration (pytester.parseconfig + the plugin's own resolution functions):
the same code pytest_configure runs, without an inner pytest session per case; a few end to end.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from bad_input_helpers import FAST, assert_one_line_usage_error, workdir  # noqa: F401 - a fixture
from helpers import BENCH, file_mtimes

from pytest_kvbench.cases import Grid
from pytest_kvbench.input_values import InputError
from pytest_kvbench.wiring.gate import Gate
from pytest_kvbench.wiring.grid import command_line, options

ARABIC_12, HUGE = "١٢", "9" * 20


SMOKE_BASELINE = BENCH.parent / "results" / "baseline-smoke.json"


def resolved(pytester, *args: str) -> Grid:
    """What pytest_configure resolves from these arguments (and the pytester directory's ini/grid files)."""
    config = pytester.parseconfig("-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args)
    command_line.check_given_options(config)
    grid = options.resolve_grid(config)
    Gate.from_config(config)
    options.results_dir(config)
    return grid


def refused(pytester, *args: str) -> str:
    with pytest.raises(InputError) as error:
        resolved(pytester, *args)
    message = str(error.value)
    assert message and "\n" not in message, message
    return message


@pytest.mark.parametrize("args, named", [
    # an empty value on top of a good one, and empty list elements: refused, not dropped
    (["--kvbench-model=default", "--kvbench-model="], "--kvbench-model"),
    (["--kvbench-methods=full", "--kvbench-methods= "], "--kvbench-methods"),
    (["--kvbench-budgets=128", "--kvbench-budgets="], "--kvbench-budgets"),
    (["--kvbench-tasks=qasper", "--kvbench-tasks="], "--kvbench-tasks"),
    (["--kvbench-methods=full,,snapkv"], "empty element"),
    (["--kvbench-budgets=128,"], "empty element"),
    (["--kvbench-seeds=0,,1"], "empty element"),
    (["--kvbench-tasks=,qasper"], "empty element"),
    (["--kvbench-context-lengths=4096, ,8192"], "empty element"),
    (["--kvbench-protocol=question_in_window,"], "empty element"),
    (["--kvbench-methods=snapkv:window="], "name=value"),
    # an empty string for an option that takes one value or path
    (["--kvbench-config="], "--kvbench-config is empty"),
    (["--kvbench-save="], "--kvbench-save is empty"),
    (["--kvbench-compare="], "--kvbench-compare is empty"),
    (["--kvbench-shard="], "--kvbench-shard is empty"),
    (["--kvbench-compare-fail="], "--kvbench-compare-fail is empty"),
    (["--kvbench-compare-fail=latency:20%", "--kvbench-compare-fail= "], "--kvbench-compare-fail is empty"),
    (["--kvbench-compare-fail=score:1,"], "empty element"),
    (["--kvbench-compare-fail=score:1", "--kvbench-compare-fail=score:2%"], "given twice (score:1 and score:2%)"),
    (["--kvbench-preset=kvpress-leaderboard", "--kvbench-preset=kvcache-factory-longbench"],
     "--kvbench-preset given twice (kvpress-leaderboard and kvcache-factory-longbench); it takes one value"),
    (["--kvbench-preset", "kvpress-leaderboard", "--kvbench-preset=kvcache-factory-longbench"],
     "--kvbench-preset given twice"),
    (["--kvbench-samples=1", "--kvbench-samples=2", "--kvbench-samples=1"], "--kvbench-samples given 3 times"),
    (["--kvbench-dtype=float32", "--kvbench-dtype=bfloat16"], "--kvbench-dtype given twice"),
    (["--kvbench-results=a", "--kvbench-results=b"], "--kvbench-results given twice (a and b)"),
    (["--kvbench-results="], "--kvbench-results is empty"),
    (["--kvbench-resume="], "--kvbench-resume is empty"),
    (["--kvbench-timeout="], "--kvbench-timeout is empty"),
    # contradictions, with both values named
    (["--kvbench-seed=3", "--kvbench-seeds=0,1"], "--kvbench-seed 3 contradicts --kvbench-seeds 0,1"),
    (["--kvbench-methods=snapkv:window=32:window=64"], "window=32 and window=64"),
    (["--kvbench-methods=kivi+hf_quantized"], "at most one quantizer, got 2 (kivi, hf_quantized)"),
    (["--kvbench-methods=snapkv+kivi+kivi"], "at most one quantizer"),
    (["--kvbench-methods=snapkv+h2o+kivi"], "at most one eviction method"),
    (["--kvbench-methods=snapkv+kivi:window=32:snapkv.window=64"], "snapkv.window is given twice"),
    # numbers: bounded, ASCII digits only
    ([f"--kvbench-samples={HUGE}"], "up to 1,000,000"),
    (["--kvbench-samples=1000001"], "up to 1,000,000"),
    (["--kvbench-samples=" + "9" * 5000], "... (5,000 characters)"),  # read without int(), shown cut
    ([f"--kvbench-shard=1/{HUGE}"], "N <= 10,000"),
    (["--kvbench-shard=1/10001"], "N <= 10,000"),
    ([f"--kvbench-context-lengths={HUGE}"], "up to 10,000,000"),
    ([f"--kvbench-max-prompt-tokens={HUGE}"], "up to 10,000,000"),
    ([f"--kvbench-budgets={HUGE}"], "10,000,000 at most"),
    ([f"--kvbench-seeds=0,{HUGE}"], "from 0 to"),
    ([f"--kvbench-samples={ARABIC_12}"], "ASCII digits"),
    (["--kvbench-samples=1_0"], "ASCII digits"),
    ([f"--kvbench-seed={ARABIC_12}"], "ASCII digits"),
    ([f"--kvbench-seeds=0,{ARABIC_12}"], "ASCII digits"),
    (["--kvbench-tasks=niah_single_1", "--kvbench-context-lengths=٤٠٩٦"], "ASCII digits"),
    ([f"--kvbench-shard=١/٢"], "ASCII digits"),
    ([f"--kvbench-budgets={ARABIC_12}"], "invalid budget"),
    (["--kvbench-budgets=128,full"], "'full' is not a compression budget"),
    ([f"--kvbench-methods=snapkv:window={ARABIC_12}"], "parameter 'window' must be int"),
    ([f"--kvbench-tasks=niah_single_1:questions={ARABIC_12}"], "questions must be a positive integer"),
    (["--kvbench-tasks=niah_single_1:questions=2:questions=3"], "sets questions twice"),
    (["--kvbench-compare-fail=score:١"], "finite number >= 0 in ASCII digits"),
    (["--kvbench-measure-alone=task"], "--kvbench-measure-alone: unknown value 'task'; valid: item, method"),
    (["--kvbench-measure-alone=item,method"], "valid: item, method"),
])
def test_each_class_of_issue_31_is_refused_in_one_line(pytester, args, named):
    assert named in refused(pytester, *args)


@pytest.mark.parametrize("toml, named", [
    ("[kvbench]\nsamples = 2\n[other]\nx = 1", "unknown table(s) or key(s) beside [kvbench]: other"),
    ("samples = 2\n[other]\nx = 1", "unknown table(s) other"),
    ("[kvbench]\nsamples = 2\n[kvbench.extra]\nx = 1", "unknown table(s) extra"),
    ("seed = 1\nseeds = [0, 2]", "grid file grid.toml: seed 1 contradicts grid file grid.toml: seeds 0,2"),
    ('methods = ["full,,snapkv"]', "empty element"),
    ('budgets = ["128", ""]', "empty element"),
    ('models = ["default", " "]', "empty element"),
    ("samples = 1000000000000000000", "up to 1,000,000"),
    (f'samples = "{ARABIC_12}"', "ASCII digits"),
    ('measure_alone = "sometimes"', "grid file grid.toml: measure_alone: unknown value 'sometimes'; valid: item, method"),
])
def test_grid_file_classes_are_refused_in_one_line(pytester, toml, named):
    (pytester.path / "grid.toml").write_text(toml + "\n", encoding="utf-8")
    assert named in refused(pytester, "--kvbench-config=grid.toml")


@pytest.mark.parametrize("ini, named", [
    ("kvbench_seeds = 0,,1", "empty element"),
    ("kvbench_methods = full,,snapkv", "empty element"),
    ("kvbench_seed = 1\nkvbench_seeds = 0,2", "ini key kvbench_seed 1 contradicts ini key kvbench_seeds 0,2"),
    (f"kvbench_samples = {HUGE}", "up to 1,000,000"),
    ("kvbench_results =", "ini key kvbench_results is empty"),
    ("kvbench_measure_alone = always", "ini key kvbench_measure_alone: unknown value 'always'; valid: item, method"),
])
def test_ini_classes_are_refused_in_one_line(pytester, ini, named):
    pytester.makeini("[pytest]\n" + ini + "\n")
    assert named in refused(pytester)


def test_a_one_value_option_repeated_with_the_same_value_or_over_addopts_is_accepted(pytester):
    pytester.makeini("[pytest]\naddopts = --kvbench-samples=3\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--kvbench-samples=2", "--kvbench-samples", "2",
                                          "--co")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stderr.str()


def test_seed_and_seeds_at_different_levels_follow_the_usual_precedence(pytester):
    pytester.makeini("[pytest]\nkvbench_seed = 3\n")
    assert resolved(pytester, "--kvbench-seeds=0,1").seeds == [0, 1]  # the command line wins
    pytester.makeini("[pytest]\nkvbench_seeds = 0,1\n")
    assert resolved(pytester, "--kvbench-seed=5").seeds == [5]
    assert resolved(pytester).seeds == [0, 1]


def test_well_formed_values_still_resolve(pytester):
    grid = resolved(pytester, "--kvbench-methods= full , snapkv:window=16 ", "--kvbench-budgets=128,r0.5",
                    "--kvbench-samples=+3", "--kvbench-seeds=0,1", "--kvbench-shard=2/3",
                    "--kvbench-compare-fail=score:1,latency:20%", f"--kvbench-compare={SMOKE_BASELINE}")
    assert [m.label for m in grid.methods] == ["full", "snapkv(window=16)"]
    assert [b.spec for b in grid.budgets] == ["128", "r0.5"] and grid.samples == 3 and grid.seeds == [0, 1]


@pytest.mark.parametrize("args", [
    ["--kvbench-model=default", "--kvbench-model="],
    ["--kvbench-save="],
    ["--kvbench-seed=3", "--kvbench-seeds=0,1"],
    [f"--kvbench-shard=1/{HUGE}"],
    [f"--kvbench-torch-threads={'١'}"],
    ["--kvbench-timeout=١٠"],
])
def test_issue_31_classes_end_to_end(workdir, args):
    assert_one_line_usage_error(workdir, *args)


# -- the property: any value of these classes is a grid or a one-line usage error ----------------

GRID_VALUE_OPTIONS = ["--kvbench-model", "--kvbench-methods", "--kvbench-budgets", "--kvbench-tasks",
                      "--kvbench-samples", "--kvbench-seed", "--kvbench-seeds", "--kvbench-context-lengths",
                      "--kvbench-protocol", "--kvbench-dtype", "--kvbench-max-prompt-tokens", "--kvbench-shard",
                      "--kvbench-compare-fail", "--kvbench-config", "--kvbench-compare", "--kvbench-preset"]
good_values = st.sampled_from(["default", "full", "snapkv", "snapkv:window=16", "128", "r0.5", "qasper",
                               "passage_retrieval_en", "3", "0", "0,1", "4096", "question_in_window", "float32",
                               "1/2", "score:1", "snapkv+kivi"])
value_classes = (
    good_values
    | st.sampled_from(["", " ", ",", ",,", " , ", ":", "=", "/", "+", "%"])  # empty, separators only
    | st.integers(10**6, 10**40).map(str)  # huge
    | st.text(alphabet="٠١٢٣٤٥٦٧٨٩۰۱۲۳", min_size=1, max_size=6)  # non-ASCII digits
    | st.text(max_size=12)  # unicode
    | st.integers(200, 400).map(lambda n: "x" * n)  # over-long
    | st.tuples(good_values, st.sampled_from([",", ",,", ", "]), good_values | st.just("")).map("".join)
    | st.sampled_from(["../x", "/", "a_file.txt", ".", "a\x00b", "~/nope"])  # paths
)


@FAST
@given(pairs=st.lists(st.tuples(st.sampled_from(GRID_VALUE_OPTIONS), value_classes), min_size=1, max_size=3))
def test_any_value_is_a_grid_or_a_one_line_usage_error(workdir, pairs):
    args = [f"{option}={value}" for option, value in pairs]
    before = file_mtimes(workdir.path, workdir.path / "results")
    try:
        grid = resolved(workdir, *args)
    except InputError as exc:
        assert str(exc) and "\n" not in str(exc), (args, str(exc))
    except pytest.UsageError as exc:  # argparse/pytest's own refusal of the command line
        assert "\n" not in str(exc).strip(), (args, str(exc))
    else:
        assert isinstance(grid, Grid) and grid.methods and grid.budgets and grid.tasks, args
    assert file_mtimes(workdir.path, workdir.path / "results") == before, args
