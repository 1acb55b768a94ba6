"""Malformed input of every class in issue 21 is a one-line error before any work starts.

Hypothesis drives pytest options, ini keys, TOML grid keys and ``kvbench`` arguments with
malformed values: paths the OS refuses (names over the length limit, NUL bytes, a file where a
directory belongs and the reverse), hub ids the hub rejects, values of the wrong TOML type,
non-finite and non-positive numbers, empty lists, unknown names, runs outside the results
directory and empty baselines. Every one must end pytest with exit code 4 (``kvbench``: 2),
print exactly one line, show no traceback and write nothing outside the results directory.
pytest runs in this process and the pytester directory holds no test file, so no model can load.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
# Imported here, outside pytester's runs: pytester drops the modules a run imports when it ends,
# and transformers' lazy modules cannot be imported a second time into the same process.
from transformers import AttentionInterface, AutoConfig  # noqa: F401
from helpers import BENCH, file_mtimes

from pytest_kvbench import cli

FAST = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# -- malformed values, by class ---------------------------------------------------------------

long_names = st.integers(min_value=256, max_value=400).map(lambda n: "n" * n)
with_nul = st.text(alphabet="abc/", min_size=1, max_size=8).map(lambda t: f"a\x00{t}")
under_a_file = st.sampled_from(["a_file.txt/x", "a_file.txt/x/y.json"])
unusable_paths = long_names | with_nul | under_a_file

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


@pytest.fixture
def workdir(pytester, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (pytester.path / "a_file.txt").write_text("not a directory\n")
    return pytester


def assert_one_line_usage_error(pytester, *args: str) -> str:
    results = pytester.path / "results"
    before = file_mtimes(pytester.path, results)
    # the inner run does not need hypothesis's plugin; loaded again mid-test it warns of this module's strategies
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args)
    out, err = result.stdout.str(), result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, (args, out[-2000:], err[-2000:])
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ERROR: "), (args, err)
    assert "Traceback" not in out + err and "INTERNALERROR" not in out + err, (args, out, err)
    assert file_mtimes(pytester.path, results) == before, f"{args}: a file was written outside the results directory"
    return lines[0]


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


# -- the kvbench command ----------------------------------------------------------------------


@pytest.fixture
def cli_dir(tmp_path_factory):
    """A directory with one file and an empty results tree, shared by the examples (they write nothing)."""
    root = tmp_path_factory.mktemp("cli")
    (root / "a_file.txt").write_text("x\n")
    (root / "results" / "runs").mkdir(parents=True)
    return root


@st.composite
def bad_cli_arguments(draw) -> list[str]:
    run = draw(unusable_paths | st.sampled_from(["a_file.txt", "..", "/", "no_such_run", "bench_", "latest"]))
    verb = draw(st.sampled_from(["show", "export", "compare", "report", "merge", "variance", "coverage", "clean",
                                 "options"]))
    if verb in ("show", "clean"):
        return [verb, run]
    if verb == "export":
        if draw(st.booleans()):
            return ["export", run, "--format", "md"]
        return ["export", run, "--format", draw(st.sampled_from(["pdf", "", "MD"]))]
    if verb == "compare":
        return ["compare", run, run]
    if verb == "report":
        return ["report", run]
    if verb == "merge":
        return ["merge", run, run, "--into", draw(unusable_paths | st.just("a_file.txt"))]
    if verb == "coverage":
        return ["coverage", run, draw(unusable_paths | st.sampled_from(["a_file.txt", "no_such_baseline.json", ""]))]
    if verb == "variance":
        return ["variance", run, "--threshold", draw(st.sampled_from(["nan", "inf", "-1%", "0", "x"]))]
    return [draw(st.sampled_from(["list", "show"])), "--results", draw(unusable_paths | st.just("a_file.txt"))]


@FAST
@given(argv=bad_cli_arguments())
def test_malformed_kvbench_arguments_exit_2_with_one_line(cli_dir, monkeypatch, capsys, argv):
    monkeypatch.chdir(cli_dir)
    before = file_mtimes(cli_dir, cli_dir / "results")
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out, err = capsys.readouterr()
    assert code == cli.EXIT_USAGE, (argv, out, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "error" in lines[0], (argv, err)
    assert "Traceback" not in out + err
    assert file_mtimes(cli_dir, cli_dir / "results") == before


# -- issue 31: values dropped, contradictions, unbounded numbers --------------------------------
# Checked in process on the parsed configuration (pytester.parseconfig + the plugin's own resolution
# functions): the same code pytest_configure runs, without an inner pytest session per case.

from pytest_kvbench.input_values import InputError  # noqa: E402
from pytest_kvbench.wiring.grid import command_line, options  # noqa: E402
from pytest_kvbench.wiring.gate import Gate  # noqa: E402
from pytest_kvbench.cases import Grid  # noqa: E402

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


@pytest.mark.parametrize("value", ["0", "-1", "1025", "2.5", "Auto2", "١", "", "99999999999999999999999"])
def test_a_decode_batch_that_is_not_auto_or_a_whole_number_in_range_is_one_line(workdir, value):
    line = assert_one_line_usage_error(workdir, f"--kvbench-decode-batch={value}")
    assert "--kvbench-decode-batch" in line


def test_a_bad_decode_batch_ini_key_is_one_line(workdir):
    workdir.makeini("[pytest]\nkvbench_decode_batch = lots\n")
    line = assert_one_line_usage_error(workdir)
    assert "ini key kvbench_decode_batch must be 'auto' or a whole number from 1 to 1,024" in line


def test_kvbench_compare_refuses_an_empty_tolerance(cli_dir, monkeypatch, capsys):
    monkeypatch.chdir(cli_dir)
    assert cli.main(["compare", "a", "b", "--fail", ""]) == cli.EXIT_USAGE
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "empty" in lines[0], lines


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


@pytest.mark.parametrize("argv, named", [
    (["show", ""], "RUN is empty"), (["compare", "", "b"], "A is empty"), (["merge", "a", " "], "RUN is empty"),
    (["export", "a", "--format", "md", "-o", ""], "--output is empty"), (["merge", "a", "b", "--into", ""], "--into"),
    (["variance", "a", "--plot", ""], "--plot is empty"), (["report", "a", "-o", ""], "--output is empty"),
    (["list", "--results", ""], "--results is empty"), (["compare", "a", "b", "--fail", "score:1,"], "empty element"),
    (["variance", "a", "b", "--threshold", "١%"], "invalid threshold"), (["coverage", "a", ""], "BASELINE is empty"),
    (["clean", " "], "RUN is empty"),
])
def test_kvbench_refuses_empty_arguments_before_anything(cli_dir, monkeypatch, capsys, argv, named):
    monkeypatch.chdir(cli_dir)
    assert cli.main(argv) == cli.EXIT_USAGE
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert not out and len(lines) == 1 and named in lines[0], (out, lines)
