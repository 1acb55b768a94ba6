"""kvbench env RUN: what reproduces a run (commit, command, models, every package's version), as text that
is itself a pip constraints file; a missing or foreign directory is one line and exit 2."""

from __future__ import annotations

import subprocess
import sys

from packaging.requirements import Requirement
import pytest
from test_cli_support import ENVIRONMENT, OTHER_ID, RUN_ID, assert_usage_error, make_record, run_cli, write_run

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

PACKAGES = {"torch": "2.13.0+cpu", "transformers": "5.24.0", "pytest-kvbench": "0.1.0", "numpy": "2.4.6",
            "Jinja2": "3.1.6"}


def pins(text: str) -> dict[str, str]:
    """The constraints a pip constraints file holds: comment and blank lines are ignored, others must parse."""
    found = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", line
            found[requirement.name] = spec.version
    return found


def test_env_is_a_constraints_file_naming_packages_model_command_and_commit(capsys, tmp_path):
    record = make_record()
    record["model"] |= {"source": "org/model", "revision": "c0ffee" * 6 + "abcd"}
    write_run(tmp_path, [record], environment=ENVIRONMENT | {"packages": PACKAGES})
    code, out, _ = run_cli(capsys, "env", RUN_ID, "--results", tmp_path)
    assert code == 0
    assert pins(out) == {"torch": "2.13.0", "transformers": "5.24.0", "numpy": "2.4.6", "Jinja2": "3.1.6"}
    comments = [line for line in out.splitlines() if line.startswith("#")]
    assert f"#   git checkout {ENVIRONMENT['git_commit']}" in comments
    assert f"#   {ENVIRONMENT['command']}" in comments
    model = next(line for line in comments if line.startswith("# model default:"))
    for text in ("source=org/model", f"revision={'c0ffee' * 6}abcd", "dtype=float32", "attn_implementation=sdpa"):
        assert text in model
    assert any(line.startswith("# grid ") and "methods=snapkv " in line and "budgets=128" in line for line in comments)
    assert "# python 3.11.9" in comments


def test_a_run_from_before_packages_were_recorded_pins_its_main_versions(capsys, tmp_path):
    write_run(tmp_path, [make_record()])
    code, out, _ = run_cli(capsys, "env", "latest", "--results", tmp_path)
    assert code == 0 and pins(out) == ENVIRONMENT["versions"]
    assert "only the main packages" in out


def test_env_of_a_run_without_a_command_still_prints_its_packages(capsys, tmp_path):
    write_run(tmp_path, [make_record()], run_id=OTHER_ID, environment={"packages": {"torch": "2.13.0"}})
    code, out, _ = run_cli(capsys, "env", OTHER_ID, "--results", tmp_path)
    assert code == 0 and pins(out) == {"torch": "2.13.0"} and "does not record the command" in out


def test_a_missing_or_foreign_directory_is_one_line_and_exit_2(capsys, tmp_path):
    code, _, err = run_cli(capsys, "env", str(tmp_path / "nowhere"))
    assert_usage_error(code, err, "nowhere")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("not a run\n")
    code, _, err = run_cli(capsys, "env", str(tmp_path / "foreign"))
    assert_usage_error(code, err, "foreign", "not a run directory")
    code, _, err = run_cli(capsys, "env", "bench_nope", "--results", tmp_path)
    assert_usage_error(code, err, "bench_nope")


def test_env_of_a_real_run_pins_the_installed_versions(small_run):
    """The run as the harness wrote it: every installed package (read once when run.json was written)."""
    from importlib.metadata import version

    _, _, results, _ = small_run
    proc = subprocess.run([sys.executable, "-m", "pytest_kvbench.cli", "env", "latest", "--results", str(results)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    pinned = {name.lower(): value for name, value in pins(proc.stdout).items()}
    assert pinned["transformers"] == version("transformers") and pinned["pytest"] == version("pytest")
    assert pinned["torch"] == version("torch").split("+")[0] and "pytest-kvbench" not in pinned
    assert len(pinned) > 20
    assert "--kvbench-methods" in proc.stdout
    assert any(line.startswith("# model default:") and "attn_implementation=sdpa" in line
               for line in proc.stdout.splitlines())
