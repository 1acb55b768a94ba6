"""The supported transformers range: one line and exit 4 when kvbench is used with a version CI did not test,
a one-line warning when KVBENCH_ALLOW_UNTESTED_TRANSFORMERS is set, nothing for unrelated pytest runs; and
pyproject, the constraints files and the compat module agree on the range.

The installed version is faked with a transformers dist-info directory first on sys.path: the check reads
importlib.metadata, as it does for a user.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import transformers  # noqa: F401 (imported outside pytester's runs, which drop the modules they import)
from packaging.requirements import Requirement

from helpers import add_bench_files
from kvmethods.adapters import transformers_compat as compat

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def fake_transformers(pytester, monkeypatch, version: str) -> None:
    site = pytester.path / "fake_site"
    info = site / f"transformers-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: transformers\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(site))
    assert compat.installed_version() == version


def run(pytester, *args):
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args)


@pytest.mark.parametrize("version", ["5.1.0", "5.25.0", "6.0.0", "4.57.1", "not-a-version"])
def test_kvbench_options_with_an_untested_transformers_are_one_line_and_exit_4(pytester, monkeypatch, version):
    monkeypatch.delenv(compat.ALLOW_UNTESTED_ENV, raising=False)
    fake_transformers(pytester, monkeypatch, version)
    result = run(pytester, "--kvbench-methods", "full", "--co")
    lines = [line for line in result.stderr.str().splitlines() if line.strip()]
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:]
    assert len(lines) == 1, lines
    assert f"transformers {version} is installed" in lines[0] and compat.SUPPORTED_TEXT in lines[0]
    assert compat.ALLOW_UNTESTED_ENV in lines[0]


def test_bench_items_alone_are_checked_too(pytester, monkeypatch):
    monkeypatch.delenv(compat.ALLOW_UNTESTED_ENV, raising=False)
    fake_transformers(pytester, monkeypatch, "5.30.0")
    add_bench_files(pytester)
    result = run(pytester, "--co", "-q")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "transformers 5.30.0 is installed" in result.stderr.str()


def test_the_allow_variable_turns_the_refusal_into_one_warning_line(pytester, monkeypatch):
    monkeypatch.setenv(compat.ALLOW_UNTESTED_ENV, "1")
    fake_transformers(pytester, monkeypatch, "5.30.0")
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = run(pytester, "--kvbench-methods", "full", "--co", "-q")
    warnings = [line for line in result.stderr.str().splitlines() if "transformers 5.30.0" in line]
    assert result.ret == pytest.ExitCode.OK
    assert len(warnings) == 1 and warnings[0].startswith("kvbench: warning:"), result.stderr.str()


@pytest.mark.parametrize("value, on", [("1", True), ("true", True), ("YES", True), ("0", False), ("false", False),
                                       ("no", False), ("", False)])
def test_the_allow_variable_takes_the_documented_switch_values(pytester, monkeypatch, value, on):
    monkeypatch.setenv(compat.ALLOW_UNTESTED_ENV, value)
    fake_transformers(pytester, monkeypatch, "5.30.0")
    result = run(pytester, "--kvbench-methods", "full", "--co", "-q")
    assert result.ret == (pytest.ExitCode.NO_TESTS_COLLECTED if on else pytest.ExitCode.USAGE_ERROR)
    assert ("kvbench: warning:" in result.stderr.str()) is on


@pytest.mark.parametrize("value", ["garbage", "2", "on", "y", "-1", "1 1"])
@pytest.mark.parametrize("version", ["5.30.0", None])  # refused whether or not the switch would matter
def test_any_other_switch_value_is_one_line_and_exit_4(pytester, monkeypatch, value, version):
    monkeypatch.setenv(compat.ALLOW_UNTESTED_ENV, value)
    if version:
        fake_transformers(pytester, monkeypatch, version)
    result = run(pytester, "--kvbench-methods", "full", "--co", "-q")
    lines = [line for line in result.stderr.str().splitlines() if line.strip()]
    assert result.ret == pytest.ExitCode.USAGE_ERROR and len(lines) == 1, lines
    assert f"{compat.ALLOW_UNTESTED_ENV}={value!r} is not a switch value; use 1, true or yes" in lines[0]


def test_an_unrelated_pytest_run_is_not_checked(pytester, monkeypatch):
    monkeypatch.delenv(compat.ALLOW_UNTESTED_ENV, raising=False)
    fake_transformers(pytester, monkeypatch, "9.0.0")
    pytester.makepyfile("def test_ok():\n    pass\n")
    result = run(pytester)
    result.assert_outcomes(passed=1)
    assert "transformers" not in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize("version, supported", [("5.2.0", True), ("5.24.0", True), ("5.24.3", True),
                                                ("5.24.0rc1", True), ("5.1.9", False), ("5.25.0", False),
                                                ("garbage", False), (None, False)])
def test_range_problem(version, supported):
    assert (compat.range_problem(version) is None) == supported


def _pyproject_requirement(name: str) -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = [Requirement(line) for line in project["dependencies"] if Requirement(line).name == name]
    assert len(found) == 1, found
    return found[0]


def _pinned(path: Path, name: str) -> str:
    pins = [Requirement(line.split("#")[0]) for line in path.read_text().splitlines() if line.split("#")[0].strip()]
    found = [str(pin.specifier) for pin in pins if pin.name.lower() == name]
    assert len(found) == 1, (path, found)
    return found[0].removeprefix("==")


def test_pyproject_declares_the_compat_modules_range():
    assert _pyproject_requirement("transformers").specifier == compat.SUPPORTED


def test_the_constraints_files_pin_both_ends_of_the_range():
    newest, oldest = _pinned(ROOT / "constraints.txt", "transformers"), _pinned(ROOT / "constraints-kvpress.txt",
                                                                                  "transformers")
    assert newest.startswith(compat.NEWEST_TESTED + ".") and oldest.startswith(compat.OLDEST_SUPPORTED + ".")
    assert compat.range_problem(newest) is None and compat.range_problem(oldest) is None
    torch = _pyproject_requirement("torch").specifier
    for path in ("constraints.txt", "constraints-kvpress.txt"):
        assert torch.contains(_pinned(ROOT / path, "torch")), path
        assert "+" not in _pinned(ROOT / path, "torch"), f"{path}: a local version tag would not match CUDA builds"
