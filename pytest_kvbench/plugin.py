"""The pytest11 entry point: kvbench's options, ini keys and hook specs; its benchmark hooks once it is used.

pytest loads this module in every run of every project where pytest-kvbench is installed, and most of those
runs never use it, so it costs next to nothing (docs/performance.md): it declares the options and hooks, and
registers the benchmark's own plugin (run_plugin.py: the grid, one item per case, the records, the run; it
imports the case model, the task registry and results/) only when kvbench is used:
- at configure, when a --kvbench-* option or a kvbench_* ini key is given (bad values are usage errors, exit 4,
  before anything is collected), or on the controller of an xdist run (it hands every worker the run id and
  its progress channel before the workers collect);
- otherwise during collection, before the first test module whose text names kvbench is imported (its suite
  markers and the `kvbench` fixture must exist by then), or at the first test that takes `kvbench_case`.
pytest replays pytest_configure for a plugin registered after configure; the session start that the run
plugin's parts missed is replayed here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_kvbench import hookspecs
from pytest_kvbench.wiring.grid import command_line, decode_batch_option

RUN_PLUGIN = "kvbench-run"


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    command_line.add_options(parser)
    decode_batch_option.add_option(parser)


def used_at_configure(config: pytest.Config) -> bool:
    """A --kvbench-* option or a kvbench_* ini key given, or this is the controller of an xdist run."""
    if any(value not in (None, False) for dest, value in vars(config.option).items() if dest.startswith("kvbench_")):
        return True
    ini_defaults = {**command_line.INI_DEFAULTS, decode_batch_option.INI: None}
    if any(config.getini(key) != default for key, default in ini_defaults.items()):  # even a blank one
        return True
    option = config.option
    return not hasattr(config, "workerinput") and bool(
        getattr(option, "numprocesses", None) or getattr(option, "tx", None) or getattr(option, "dist", "no") != "no")


def mentions_kvbench(path: Path) -> bool:
    """A test module that uses the benchmark (the `kvbench` fixture, `kvbench_case`) names kvbench."""
    try:
        return b"kvbench" in Path(path).read_bytes()
    except OSError:
        return False


def activate(config: pytest.Config, session: pytest.Session | None = None):
    """Register the benchmark's plugin (pytest replays pytest_configure for it) and return it; `session`: it
    comes in during collection, so the session start its parts missed is replayed."""
    from pytest_kvbench import run_plugin  # lazy for startup time: the grid, the task registry and results/

    if config.pluginmanager.has_plugin(RUN_PLUGIN):
        return run_plugin
    config.pluginmanager.register(run_plugin, RUN_PLUGIN)
    if session is not None:
        run_plugin.replay_session_start(config, session)
    return run_plugin


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # `pytest --markers` lists the suite markers (smoke, ruler, ...), which the run plugin registers
    if used_at_configure(config) or getattr(config.option, "markers", False):
        activate(config)


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path, parent) -> None:
    """Before a test module that uses the benchmark is imported."""
    if not parent.config.pluginmanager.has_plugin(RUN_PLUGIN) and mentions_kvbench(module_path):
        activate(parent.config, parent.session)


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A benchmark test that its module's text did not reveal (`kvbench_case` from a conftest)."""
    if "kvbench_case" in metafunc.fixturenames and not metafunc.config.pluginmanager.has_plugin(RUN_PLUGIN):
        run_plugin = activate(metafunc.config, metafunc.definition.session)
        run_plugin.pytest_generate_tests(metafunc)  # registered during this hook call: pluggy calls it from the next
