"""Live progress: rewritten in place on a terminal, plain lines otherwise, nothing under -q or in junitxml."""

import re

import pytest

from helpers import HOOK_CONFTEST, run_bench

GRID = ["--kvbench-methods", "full,snapkv", "--kvbench-budgets", "16", "--kvbench-tasks", "niah_single_1",
        "--kvbench-context-lengths", "256", "--kvbench-samples", "3", "--kvbench-max-prompt-tokens", "320"]
TTY_CONFTEST = HOOK_CONFTEST + (
    "import pytest\n"
    "@pytest.hookimpl(trylast=True)\n"
    "def pytest_configure(config):\n"
    "    config.pluginmanager.get_plugin('terminalreporter').isatty = lambda: True\n"
)
LINE = re.compile(r"\[kvbench\] (\S+): (\d+)/3 samples, [\d.]+ s/sample, item ETA \S+; items (\d+)/2")


def run(tmp_path, *args, conftest=HOOK_CONFTEST):
    work = tmp_path / "work"
    work.mkdir()
    (work / "conftest.py").write_text(conftest)
    proc = run_bench(work, *GRID, "--kvbench-results", str(tmp_path / "res"),
                     f"--junitxml={tmp_path / 'junit.xml'}", *args, keep_carriage_returns=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc.stdout, (tmp_path / "junit.xml").read_text()


def test_a_terminal_gets_one_line_rewritten_per_sample_and_erased(tmp_path):
    out, junit = run(tmp_path, conftest=TTY_CONFTEST)
    shown = LINE.findall(out)
    assert [(item, int(done)) for item, done, _ in shown] == [
        ("full-niah_single_1-ctx256", n) for n in (1, 2, 3)] + [("snapkv-16-niah_single_1-ctx256", n) for n in (1, 2, 3)]
    assert "\r[kvbench] full-niah_single_1-ctx256: 2/3" in out  # in place, not new lines
    assert int(shown[-1][2]) == 1 and "session ETA" in out  # one item finished when the second runs
    assert "[kvbench]" not in junit


def test_a_log_gets_plain_lines(tmp_path):
    out, junit = run(tmp_path)
    assert len(LINE.findall(out)) == 6
    assert "\r" not in out
    assert all(line.startswith("[kvbench] ") for line in out.splitlines() if LINE.search(line))
    assert "[kvbench]" not in junit


def test_quiet_runs_show_no_progress(tmp_path):
    out, junit = run(tmp_path, "-q")
    assert "[kvbench]" not in out and "[kvbench]" not in junit
