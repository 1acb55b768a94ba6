"""The installed transformers must be one CI tested (kvmethods.adapters.transformers_compat.SUPPORTED), checked once
pytest-kvbench is used.

An untested transformers fails in the middle of a run (a renamed keyword, a moved class), long after the
grid was accepted. This check turns that into one line at startup, a usage error (exit 4), before any model
loads. It reads the version with importlib.metadata (transformers itself is not imported: a version too new
may not even import our code) and runs only when kvbench is used, so unrelated pytest runs of users who
have the plugin installed never see it. KVBENCH_ALLOW_UNTESTED_TRANSFORMERS=1 (the scheduled drift job)
turns the refusal into a one-line warning. Every KVBENCH_* switch (ENV_SWITCHES) takes 1/true/yes or
0/false/no or empty, checked here whatever the version: any other value is one line, exit 4.
"""

from __future__ import annotations

import sys

import pytest
from kvmethods.adapters.transformers_compat import ALLOW_UNTESTED_ENV, installed_version, range_problem
from pytest_kvbench.input_values import InputError, env_switch

CHECKED_KEY = pytest.StashKey[bool]()
ENV_SWITCHES = (ALLOW_UNTESTED_ENV,)  # the KVBENCH_* environment variables that are on/off switches


def kvbench_options_given(config: pytest.Config) -> bool:
    """Whether any --kvbench-* option was given (a store_true option set, any other not None)."""
    return any(value not in (None, False) for dest, value in vars(config.option).items() if dest.startswith("kvbench_"))


def check_transformers(config: pytest.Config) -> None:
    """Once per session: a usage error naming the installed and supported versions when transformers is
    outside the supported range, or a one-line warning on stderr when untested versions are allowed."""
    if config.stash.get(CHECKED_KEY, False):
        return
    config.stash[CHECKED_KEY] = True
    try:
        switches = {name: env_switch(name) for name in ENV_SWITCHES}
    except InputError as exc:
        raise pytest.UsageError(str(exc)) from None
    problem = range_problem(installed_version())
    if problem is None:
        return
    if switches[ALLOW_UNTESTED_ENV]:
        sys.stderr.write(f"kvbench: warning: {problem}; running anyway ({ALLOW_UNTESTED_ENV} is set)\n")
        return
    raise pytest.UsageError(f"{problem}. Install a tested version (pip install -c constraints.txt, see "
                            f"docs/install.md) or set {ALLOW_UNTESTED_ENV}=1 to run anyway")
