"""``--kvbench-mlflow URI`` / ``--kvbench-wandb PROJECT`` and their ini keys: which trackers a run asked for.

Light on purpose (pytest only): registered with every option (command_line.py); run_plugin.py asks at configure,
and imports the trackers (wiring/trackers/) only when one is asked.
"""

from __future__ import annotations

import pytest

OPTIONS = {"mlflow": ("URI", "log the run to MLflow: a tracking server (http://host:5000) or a file: store; "
                              "needs the [mlflow] extra"),
           "wandb": ("PROJECT", "log the run to a Weights & Biases project (WANDB_MODE=offline: a local run "
                                "directory for `wandb sync`); needs the [wandb] extra")}
INI_DEFAULTS = {f"kvbench_{name}": None for name in OPTIONS}


def add_options(parser: pytest.Parser, group) -> None:
    for name, (metavar, help_text) in OPTIONS.items():
        group.addoption(f"--kvbench-{name}", dest=f"kvbench_{name}", default=None, metavar=metavar, help=help_text)
        parser.addini(f"kvbench_{name}", help_text + f" (--kvbench-{name})", default=None)


def requested(config: pytest.Config) -> dict[str, str]:
    """tracker name -> its target (the command line's, else the ini key's); a blank ini value is a usage error
    (the command line's blank values are refused with every option's, command_line.check_given_options)."""
    targets = {}
    for name in OPTIONS:
        value = config.getoption(f"kvbench_{name}")
        if value is None:
            value = config.getini(f"kvbench_{name}")
            if value is not None and not str(value).strip():
                raise pytest.UsageError(f"ini key kvbench_{name} is empty; give a value or leave it out")
        if value:
            targets[name] = str(value).strip()
    return targets
