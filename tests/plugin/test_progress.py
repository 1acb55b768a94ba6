"""Live progress: rewritten in place on a terminal, plain lines otherwise, nothing under -q or in junitxml."""

import re

import pytest

from helpers import HOOK_CONFTEST, run_bench

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

GRID = ["--kvbench-methods", "full,snapkv", "--kvbench-budgets", "16", "--kvbench-tasks", "niah_single_1",
        "--kvbench-context-lengths", "256", "--kvbench-samples", "3", "--kvbench-max-prompt-tokens", "320"]
TTY_CONFTEST = HOOK_CONFTEST + (
    "import pytest\n"
    "@pytest.hookimpl(trylast=True)\n"
    "def pytest_configure(config):\n"
    "    config.pluginmanager.get_plugin('terminalreporter').isatty = lambda: True\n"
)
LINE = re.compile(r"\[kvbench\] (\S+): (\d+)/3 samples, [\d.]+ s/sample, item ETA \S+;(?: [^;\r\n[]+;)? items (\d+)/2")


def run(tmp_path, *args, conftest=HOOK_CONFTEST, env=None):
    work = tmp_path / "work"
    work.mkdir()
    (work / "conftest.py").write_text(conftest)
    proc = run_bench(work, *GRID, "--kvbench-results", str(tmp_path / "res"),
                     f"--junitxml={tmp_path / 'junit.xml'}", *args, keep_carriage_returns=True, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return proc.stdout, (tmp_path / "junit.xml").read_text()


def test_a_terminal_gets_one_line_rewritten_per_sample_and_erased(tmp_path):
    out, junit = run(tmp_path, conftest=TTY_CONFTEST)
    shown = LINE.findall(out)
    assert [(item, int(done)) for item, done, _ in shown] == [
        ("full-niah_single_1-ctx256", n) for n in (1, 2, 3)] + [("snapkv-16-niah_single_1-ctx256", n) for n in (1, 2, 3)]
    assert "\r[kvbench] full-niah_single_1-ctx256: 2/3" in out  # in place, not new lines
    assert int(shown[-1][2]) == 1 and "session ETA" in out  # one item finished when the second runs
    # full's run decodes snapkv's sample right after the shared prefill (a group of one member: alone)
    assert "full-niah_single_1-ctx256: 1/3 samples" in out and "; 1 member decoded alone; items 0/2" in out
    assert "[kvbench]" not in junit


def test_a_log_gets_plain_lines(tmp_path):
    out, junit = run(tmp_path, "-o", "kvbench_progress_interval=0")
    assert len(LINE.findall(out)) == 6
    assert "\r" not in out
    assert all(line.startswith("[kvbench] ") for line in out.splitlines() if LINE.search(line))
    assert "[kvbench]" not in junit


ITEM_LINE = re.compile(r"^\[kvbench\] (\S+) passed in [\d.]+ s, score [\d.]+; items (\d)/2(, session ETA \S+)?$", re.M)


def test_a_log_gets_one_line_per_finished_item_instead_of_file_names_and_dots(tmp_path):
    out, junit = run(tmp_path)
    finished = ITEM_LINE.findall(out)
    assert [(item, done) for item, done, _ in finished] == [("full-niah_single_1-ctx256", "1"),
                                                           ("snapkv-16-niah_single_1-ctx256", "2")]
    assert finished[-1][2] == ", session ETA 0s"  # nothing left after the last item
    lines = out.splitlines()
    assert not [line for line in lines if re.fullmatch(r"test_ruler\.py\s*\.*", line)]  # no file name line
    assert not [line for line in lines if re.fullmatch(r"[.FEsx]+(\s+\[\s*\d+%\])?", line.strip())]  # no dots
    assert "2 passed" in out and "[kvbench]" not in junit


def test_quiet_runs_show_no_progress(tmp_path):
    out, junit = run(tmp_path, "-q")
    assert "[kvbench]" not in out and "[kvbench]" not in junit


# -- under xdist: the controller shows the workers' progress -------------------------------------

WORKER_LINE = re.compile(r"^\[kvbench\] (gw\d+) (\S+) (\d+)/3 [\d.]+ s/sample ETA \S+(?: \([^)]*\))?; items (\d+)/2", re.M)
XDIST = ["-p", "xdist", "-n", "2", "--dist", "loadgroup", "--kvbench-torch-threads", "1"]
BOARD_ROW = re.compile("\x1b7\x1bD\r\x1b\\[K(.*?)\x1b8")  # progress_board's drawing: down a row, draw, back


@pytest.fixture(scope="module")
def xdist_runs(tmp_path_factory):
    """stdout and junitxml of -n 2 runs: a log with a line per sample, quiet, and a (faked) terminal."""
    runs = {}
    for name, args, conftest in [("log", ["-o", "kvbench_progress_interval=0"], HOOK_CONFTEST),
                                 ("quiet", ["-q", "-o", "kvbench_progress_interval=0"], HOOK_CONFTEST),
                                 ("tty", [], TTY_CONFTEST)]:
        # wide enough that the terminal row holds both workers' parts uncut
        runs[name] = run(tmp_path_factory.mktemp(name), *XDIST, *args, conftest=conftest, env={"COLUMNS": "300"})
    return runs


def test_under_xdist_a_log_gets_every_workers_samples(xdist_runs):
    out, junit = xdist_runs["log"]
    shown = WORKER_LINE.findall(out)
    by_item = {}
    for worker, item, done, _ in shown:
        by_item.setdefault(item, []).append((worker, int(done)))
    assert sorted(by_item) == ["full-niah_single_1-ctx256", "snapkv-16-niah_single_1-ctx256"]
    for item, seen in by_item.items():
        assert [done for _, done in seen] == [1, 2, 3], item
        assert len({worker for worker, _ in seen}) == 1, item  # one worker ran the item
    finished = ITEM_LINE.findall(out)
    assert sorted(item for item, _, _ in finished) == sorted(by_item)  # a line per finished item, no dots
    # the sharing groups' ETA (a part of the group per worker): each line has one, nothing left at the end
    assert all(eta for _, _, eta in finished) and finished[-1][2] == ", session ETA 0s"
    assert out.count("[kvbench]") == len(shown) + len(finished) == 8  # every line on a line of its own
    assert "\r" not in out and "\x1b" not in out
    assert not re.search(r"^\.+", out, re.M)
    assert "[kvbench]" not in junit


def test_under_xdist_quiet_runs_show_no_progress(xdist_runs):
    out, junit = xdist_runs["quiet"]
    assert "[kvbench]" not in out and "[kvbench]" not in junit and "2 passed" in out


def _junit_shape(junit: str) -> list:
    """What junitxml says of each test, without what differs from run to run (times, host, timings)."""
    import xml.etree.ElementTree as ET

    cases = []
    for case in ET.fromstring(junit).iter("testcase"):
        properties = sorted((p.get("name"), p.get("value") if p.get("name") in ("kvbench_score", "kvbench_metric")
                             else None) for p in case.iter("property"))
        outputs = [(child.tag, child.text) for child in case if child.tag != "properties"]
        cases.append((case.get("classname"), case.get("name"), properties, outputs))
    return sorted(cases)


def test_under_xdist_junitxml_is_the_same_with_and_without_progress(xdist_runs):
    shape = _junit_shape(xdist_runs["log"][1])
    assert len(shape) == 2 and all(properties for _, _, properties, _ in shape)
    assert shape == _junit_shape(xdist_runs["quiet"][1])


def test_under_xdist_a_terminal_gets_one_row_below_the_dots(xdist_runs):
    out, junit = xdist_runs["tty"]
    rows = [row for row in BOARD_ROW.findall(out) if row]
    assert rows and all(row.startswith("[kvbench] gw") for row in rows)
    seen = {(item, int(done)) for row in rows for item, done in re.findall(r"gw\d+ (\S+) (\d)/3 ", row)}
    assert seen == {(item, done) for item in ("full-niah_single_1-ctx256", "snapkv-16-niah_single_1-ctx256")
                    for done in (1, 2, 3)}
    assert out.count("[kvbench]") == len(rows)  # nothing shown outside the drawn row
    assert BOARD_ROW.findall(out)[-1] == ""  # cleared at the end
    # without the drawing, the output is pytest's own: the dots and [100%] on one line
    plain = BOARD_ROW.sub("", out).replace("\x1bD\x1bM", "")
    assert "\x1b" not in plain and re.search(r"^\.\.\s+\[100%\]$", plain, re.M)
    assert "[kvbench]" not in junit
