"""--kvbench-mlflow / --kvbench-wandb bad input, in every environment: a missing extra is one line naming it, a blank
value or ini key is one line, all before anything is collected or loaded (docs/bad-input.md)."""

import sys

import pytest

from helpers import file_mtimes

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


def one_line_usage_error(pytester, *args: str) -> str:
    results = pytester.path / "results"
    before = file_mtimes(pytester.path, results)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:hypothesispytest", "--collect-only",
                                          *args)
    out, err = result.stdout.str(), result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, (args, out[-2000:], err[-2000:])
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ERROR: "), (args, err)
    assert "Traceback" not in out + err and "INTERNALERROR" not in out + err
    assert file_mtimes(pytester.path, results) == before
    return lines[0]


@pytest.mark.parametrize("tracker, target, module", [("mlflow", "http://127.0.0.1:9", "mlflow"),
                                                     ("wandb", "my-project", "wandb")])
def test_a_missing_extra_is_one_line_naming_it(pytester, monkeypatch, tracker, target, module):
    monkeypatch.setitem(sys.modules, module, None)  # what `import mlflow` meets where the extra is not installed
    line = one_line_usage_error(pytester, f"--kvbench-{tracker}={target}")
    assert line == (f"ERROR: --kvbench-{tracker} needs the {module} client, which is not installed: "
                    f"pip install 'pytest-kvbench[{tracker}]'")


@pytest.mark.parametrize("tracker", ["mlflow", "wandb"])
def test_a_blank_value_or_ini_key_is_one_line(pytester, tracker):
    assert f"--kvbench-{tracker} is empty" in one_line_usage_error(pytester, f"--kvbench-{tracker}= ")
    pytester.makeini(f"[pytest]\nkvbench_{tracker} =\n")
    assert f"ini key kvbench_{tracker} is empty" in one_line_usage_error(pytester)
