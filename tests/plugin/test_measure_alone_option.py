"""--kvbench-measure-alone item|method (ini key kvbench_measure_alone, grid-file key `measure_alone`): how often a
method's own decode speed is measured on a sample decoded alone. A bad value is one line at configure (exit 4:
tests/plugin/test_grid_refusals.py); the engine's side is tests/engine/test_batched_group_decode.py, the table's
tests/results/test_tables.py."""

from __future__ import annotations

import pytest

from pytest_kvbench.cases import Grid


@pytest.fixture
def workdir(pytester, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    pytester.makepyfile(test_grid="""
        def test_grid(request):
            from pytest_kvbench.wiring.grid.options import resolve_grid
            assert resolve_grid(request.config).measure_alone == request.config.getini("expected")
    """)
    return pytester


@pytest.mark.parametrize("given, expected", [
    ([], "item"),
    (["--kvbench-measure-alone", "method"], "method"),
    (["--kvbench-config", "grid.toml"], "method"),
    (["--kvbench-config", "grid.toml", "--kvbench-measure-alone=item"], "item"),  # the command line wins
])
def test_the_setting_reaches_the_grid_from_the_command_line_or_the_grid_file(workdir, given, expected):
    (workdir.path / "pytest.ini").write_text(f"[pytest]\nexpected = {expected}\n")
    (workdir.path / "conftest.py").write_text('def pytest_addoption(parser):\n    parser.addini("expected", "")\n')
    (workdir.path / "grid.toml").write_text('measure_alone = "method"\n')
    result = workdir.runpytest_inprocess("-p", "no:cacheprovider", *given, "test_grid.py")
    assert result.ret == 0, result.stdout.str()


def test_a_run_records_the_setting_where_it_is_not_the_default():
    """settings.json and run.json hold Grid.as_dict(): a run that measured speeds per method says so, and a
    resumed run that changes it is a changed setting; older runs' settings (per item) stay equal."""
    assert Grid(measure_alone="method").as_dict()["measure_alone"] == "method"
    assert "measure_alone" not in Grid().as_dict()
