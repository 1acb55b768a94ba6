"""What every bad-input test needs: hypothesis's settings, paths the OS refuses, a pytester directory holding a
file, and the check that a pytest run ended in one line (exit 4) having written nothing outside its results.

Imported by the test modules of tests/plugin/ that check refusals (docs/bad-input.md).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
# Imported here, outside pytester's runs: pytester drops the modules a run imports when it ends,
# and transformers' lazy modules cannot be imported a second time into the same process.
from transformers import AttentionInterface, AutoConfig  # noqa: F401
from helpers import file_mtimes

FAST = settings(max_examples=60, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# paths the OS refuses: names over the length limit, NUL bytes, a file where a directory belongs
long_names = st.integers(min_value=256, max_value=400).map(lambda n: "n" * n)
with_nul = st.text(alphabet="abc/", min_size=1, max_size=8).map(lambda t: f"a\x00{t}")
under_a_file = st.sampled_from(["a_file.txt/x", "a_file.txt/x/y.json"])
unusable_paths = long_names | with_nul | under_a_file


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
