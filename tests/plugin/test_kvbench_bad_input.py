"""Malformed `kvbench` arguments exit 2 with one line and write nothing: paths the OS refuses, unknown runs and
formats, bad thresholds and tolerances, empty arguments (docs/bad-input.md; the pytest side: test_bad_input.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from bad_input_helpers import FAST, unusable_paths
from helpers import file_mtimes

from pytest_kvbench import cli

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


def test_kvbench_compare_refuses_an_empty_tolerance(cli_dir, monkeypatch, capsys):
    monkeypatch.chdir(cli_dir)
    assert cli.main(["compare", "a", "b", "--fail", ""]) == cli.EXIT_USAGE
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "empty" in lines[0], lines


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
