"""Property: any value of any ``--kvbench-*`` option or grid-file key is a valid configuration or a short usage error.

Every option the plugin registers (read from ``command_line.add_options``, so a new option is covered the day it is
added) and every key of the ``--kvbench-config`` TOML grid file gets values from the classes of issue 31: empty,
separators only, huge numbers, non-ASCII digits, unicode, over-long, paths of every kind, beside values that
work. pytest's whole configure step then runs in this process (``--collect-only``, no test file, so no model
can load), and it must end with a configuration (no tests collected, exit 5) or a usage error (exit 4) of at
most 4 lines: never a traceback, an internal error, or a file written outside the results directory.

``KVBENCH_PROPERTY_EXAMPLES=N`` runs N random examples per test instead of the quick derandomized profile.
"""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
# Imported here, outside pytester's runs: pytester drops the modules a run imports when it ends,
# and transformers' lazy modules cannot be imported a second time into the same process.
from transformers import AttentionInterface, AutoConfig  # noqa: F401

from helpers import file_mtimes

from pytest_kvbench.engine import models
from pytest_kvbench.wiring.grid import command_line, grid_file

_EXAMPLES = os.environ.get("KVBENCH_PROPERTY_EXAMPLES")
PROFILE = settings(max_examples=int(_EXAMPLES) if _EXAMPLES else 30, deadline=None, derandomize=not _EXAMPLES,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class _RecordingParser:
    """Stands in for pytest's parser: which options and ini keys the plugin registers, and which are flags."""

    def __init__(self) -> None:
        self.options: dict[str, bool] = {}  # option -> takes no value (store_true)
        self.ini_keys: list[str] = []

    def getgroup(self, *args, **kwargs):
        return self

    def addoption(self, name, **kwargs) -> None:
        self.options[name] = kwargs.get("action") == "store_true"

    def addini(self, name, *args, **kwargs) -> None:
        self.ini_keys.append(name)


_REGISTERED = _RecordingParser()
command_line.add_options(_REGISTERED)
VALUE_OPTIONS = sorted(name for name, flag in _REGISTERED.options.items() if not flag)
FLAG_OPTIONS = sorted(name for name, flag in _REGISTERED.options.items() if flag)

# -- values, by class ---------------------------------------------------------------------------

# values that work, per option (others draw from a mixed list), so that valid configurations come up too
WORKING = {
    "--kvbench-model": ["default"], "--kvbench-methods": ["full", "snapkv:window=16", "full,snapkv", "snapkv+kivi"],
    "--kvbench-budgets": ["128", "r0.5", "64,128"], "--kvbench-tasks": ["qasper", "passage_retrieval_en,niah_single_1"],
    "--kvbench-samples": ["1", "3"], "--kvbench-seed": ["0", "7"], "--kvbench-seeds": ["0,1"],
    "--kvbench-context-lengths": ["1024", "4096"], "--kvbench-protocol": ["question_in_window", "query_agnostic"],
    "--kvbench-dtype": ["auto", "float32"], "--kvbench-attn-implementation": ["sdpa", "eager"],
    "--kvbench-data": ["fixtures"], "--kvbench-max-prompt-tokens": ["320"], "--kvbench-preset": ["kvpress-leaderboard"],
    "--kvbench-config": ["grid.toml"], "--kvbench-results": ["results", "a_dir"], "--kvbench-save": ["baseline.json"],
    "--kvbench-compare-fail": ["score:1", "latency:20%"], "--kvbench-shard": ["1/2", "2/2"],
    "--kvbench-timeout": ["2.5", "60"], "--kvbench-torch-threads": ["1"], "--kvbench-decode-batch": ["auto", "1", "8"],
}
working = st.sampled_from(sorted({value for values in WORKING.values() for value in values}))
empty = st.sampled_from(["", " ", "\t", "\n"])
separators = st.text(alphabet=",:=/+%. ;", min_size=1, max_size=4)
huge = st.integers(10**6, 10**60).map(str) | st.integers(-(10**40), -1).map(str) | st.just("1e999")
non_ascii_digits = st.text(alphabet="٠١٢٣٤٥٦٧٨٩۰۱۲۳४५६௧๒１２３", min_size=1, max_size=6)
unicode = st.text(min_size=1, max_size=16)
over_long = st.integers(256, 5000).map(lambda n: "7" * n) | st.integers(256, 600).map(lambda n: "a" * n)
paths = st.sampled_from([".", "..", "/", "./", "../..", "~", "~/nope", "/nonexistent/dir/x", "a_file.txt",
                         "a_file.txt/under", "a_dir", "a_dir/", "a_dir/../a_file.txt", "a\x00b", "x" * 300,
                         "/" + "y" * 255 + "/z", "a_dir/" + "w" * 256, "results/runs", "C:\\x", "file:///tmp",
                         "-", "-rf"])
malformed = empty | separators | huge | non_ascii_digits | unicode | over_long | paths
values = working | malformed
in_a_list = st.lists(values, min_size=2, max_size=3).map(",".join)  # list elements from the classes too


def option_values(option: str) -> st.SearchStrategy[str]:
    """``--option=value`` (a value starting with '-' is still a value): one that works for it, or any."""
    fitting = st.sampled_from(WORKING[option]) if option in WORKING else working
    return st.one_of(fitting, malformed, in_a_list).map(lambda value: f"{option}={value}")


command_lines = st.lists(st.sampled_from(VALUE_OPTIONS + FLAG_OPTIONS).flatmap(
    lambda option: st.just(option) if option in FLAG_OPTIONS else option_values(option)), min_size=1, max_size=4)


toml_scalars = values | st.integers(-(2**63), 2**63 - 1) | st.booleans() | st.floats(allow_nan=False)
toml_any = toml_scalars | st.lists(toml_scalars, max_size=3) | st.dictionaries(
    st.sampled_from(["name", "window", "kernel", "x"]), toml_scalars, max_size=2)


def toml_entries(key: str) -> st.SearchStrategy[tuple[str, object]]:
    """(key, value): a value that works for the key (its option's), as a string or in an array, or any."""
    option = "--kvbench-" + ("model" if key == "models" else key.replace("_", "-"))
    fitting = st.sampled_from(WORKING.get(option, ["default"]))
    return st.one_of(fitting, fitting.map(lambda value: [value]), toml_any).map(lambda value: (key, value))


toml_tables = st.lists(st.sampled_from(sorted(grid_file.TOML_KEYS)).flatmap(toml_entries)
                       | st.tuples(st.sampled_from(["unknown", "kvbench", "model s", ""]), toml_any),
                       min_size=1, max_size=3).map(dict)


def toml_text(table: dict) -> str:
    """A TOML document of these keys; strings as JSON strings (valid TOML basic strings, or a refusal to read)."""

    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v) if not isinstance(v, float) or v == v and abs(v) != float("inf") else "0"
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        return json.dumps(v, ensure_ascii=False)

    return "".join(f"{json.dumps(key, ensure_ascii=False)} = {value(v)}\n" for key, v in table.items())


LONG = 100  # characters: a value this long is shown cut short in a refusal

def _strings(value):
    """Every string in a TOML value (keys and nested values too)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield key
            yield from _strings(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _strings(inner)


# -- the property -------------------------------------------------------------------------------


@pytest.fixture
def workdir(pytester, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(models.ModelCache, "_load", lambda self, *a: pytest.fail(f"a model loaded: {a}"))
    (pytester.path / "a_file.txt").write_text("a file\n")
    (pytester.path / "a_dir").mkdir()
    (pytester.path / "grid.toml").write_text('methods = ["full"]\n')
    return pytester


def assert_configuration_or_short_usage_error(pytester, *args: str, given: list[str]) -> None:
    before = file_mtimes(pytester.path, pytester.path / "results")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--collect-only",
                                          *args)
    out, err = result.stdout.str(), result.stderr.str()
    assert "Traceback" not in out + err and "INTERNALERROR" not in out + err, (args, out[-3000:], err[-3000:])
    assert result.ret in (pytest.ExitCode.NO_TESTS_COLLECTED, pytest.ExitCode.USAGE_ERROR), (args, out[-2000:], err)
    if result.ret == pytest.ExitCode.USAGE_ERROR:
        lines = [line for line in err.splitlines() if line.strip()]
        assert 1 <= len(lines) <= 4, (args, err)
        # readable: a refusal shows an over-long value cut short (input_values.shown), never in full
        echoed = [value for value in given if len(value) > LONG and value in err]
        assert not echoed, (args, err[:3000])
    assert file_mtimes(pytester.path, pytester.path / "results") == before, f"{args}: a file was written"


@PROFILE
@given(args=command_lines)
def test_any_option_value_is_a_configuration_or_a_short_usage_error(workdir, args):
    assert_configuration_or_short_usage_error(workdir, *args, given=[arg.partition("=")[2] for arg in args])


@PROFILE
@given(table=toml_tables, under_kvbench=st.booleans())
def test_any_grid_file_is_a_configuration_or_a_short_usage_error(workdir, table, under_kvbench):
    text = toml_text(table)
    (workdir.path / "any.toml").write_text("[kvbench]\n" + text if under_kvbench else text, encoding="utf-8")
    assert_configuration_or_short_usage_error(workdir, "--kvbench-config", "any.toml", given=list(_strings(table)))

