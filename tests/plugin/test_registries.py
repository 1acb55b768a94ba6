"""The four kinds of names (methods, tasks, named models, presets) served by one registry type: each kind lists
without torch, takes third-party names from its entry-point group of an installed distribution's metadata, and
refuses an unknown name in the one shape naming the closest ones."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvmethods import get_method
from kvmethods.core.errors import MethodError
from pytest_kvbench.model_sources import named_models
from pytest_kvbench.model_sources.named_models import MODELS, NamedModelError
from pytest_kvbench.tasks import registry as tasks
from pytest_kvbench.tasks.errors import TaskError
from pytest_kvbench.wiring.grid.presets import PRESETS, load_preset
from pytest_kvbench.cases import GridError

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

ROOT = Path(__file__).resolve().parents[2]
LISTINGS = {
    "methods": "from kvmethods.registry import METHODS as R",
    "tasks": "from pytest_kvbench.tasks.registry import TASKS as R",
    "models": "from pytest_kvbench.model_sources.named_models import MODELS as R",
    "presets": "from pytest_kvbench.wiring.grid.presets import PRESETS as R",
}


@pytest.mark.parametrize("kind", sorted(LISTINGS))
def test_listing_a_kind_imports_no_torch(kind):
    code = (f"import sys; {LISTINGS[kind]}; names = R.names(); assert names and all(n in R for n in names); "
            "heavy = [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]; "
            "assert not heavy, heavy; print(len(names))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) > 1


@pytest.mark.parametrize("refuse, error, line", [
    (lambda: get_method("snapk"), MethodError, "unknown method 'snapk' (did you mean 'snapkv'"),
    (lambda: tasks.get_task("qaspr"), TaskError, "unknown task 'qaspr' (did you mean 'qasper'"),
    (lambda: named_models.resolve("smollm2"), NamedModelError, "unknown model 'smollm2' (did you mean 'smollm2-135m'"),
    (lambda: load_preset("kvpress"), GridError, "unknown preset 'kvpress' (did you mean 'kvpress-leaderboard'"),
])
def test_every_kind_refuses_an_unknown_name_in_one_shape(refuse, error, line):
    with pytest.raises(error) as refused:
        refuse()
    message = str(refused.value)
    assert message.startswith(line) and "?); valid " in message and "\n" not in message


def install(root: Path, module: str, source: str, points: dict[str, dict[str, str]]) -> None:
    """A module and an installed distribution's metadata declaring entry points, as pip would leave them."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    dist = root / f"{module}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module.replace('_', '-')}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in names.items())
        for group, names in points.items()))


PLUGIN = """
    from pathlib import Path
    from pytest_kvbench.model_sources.named_models import NamedModel
    from pytest_kvbench.tasks.base import Task

    class CountingTask(Task):
        suite = "ruler"

        def __init__(self):
            self.name, self.metric_name, self.max_new_tokens = "counting_test", "exact", 4

    MODEL = NamedModel("tiny-plugin-model", "a plugin's model", "tiny-plugin-dist", "tiny.gguf", "pip install tiny")
    PRESET = Path(__file__).with_name("plugin_preset.toml")
    NOT_A_MODEL = 42
"""
PRESET_TOML = """
description = "a plugin's protocol"
source = "example/protocol@0000000"
export = "kvpress"

[settings.context_lengths]
rule = "exact"
values = [4096]
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    install(tmp_path, "kvbench_plugin_kinds", PLUGIN, {
        "kvbench.tasks": {"counting_test": "kvbench_plugin_kinds:CountingTask"},
        "kvbench.models": {"tiny-plugin-model": "kvbench_plugin_kinds:MODEL",
                           "not-a-model": "kvbench_plugin_kinds:NOT_A_MODEL"},
        "kvbench.presets": {"plugin-protocol": "kvbench_plugin_kinds:PRESET"},
    })
    (tmp_path / "plugin_preset.toml").write_text(PRESET_TOML)
    monkeypatch.syspath_prepend(str(tmp_path))
    load_preset.cache_clear()
    yield
    load_preset.cache_clear()


def test_a_distribution_adds_a_task(plugin):
    assert "counting_test" in tasks.available_tasks() and "counting_test" in tasks.available_tasks("ruler")
    assert tasks.suite_of("counting_test") == "ruler"
    task = tasks.get_task("counting_test")
    assert type(task).__name__ == "CountingTask" and task.name == "counting_test"
    row = next(row for row in tasks.task_listing("ruler") if row["task"] == "counting_test")
    assert row["metric"] == "exact" and "kvbench.tasks" in row["source"]
    with pytest.raises(TaskError, match=r"takes no settings"):
        tasks.get_task("counting_test:max_new_tokens=8")


def test_a_distribution_adds_a_named_model(plugin):
    assert MODELS.names()[-2:] == ["not-a-model", "tiny-plugin-model"]  # after named_models.toml's, in its order
    assert MODELS.get("tiny-plugin-model").description == "a plugin's model"
    with pytest.raises(NamedModelError, match=r"its GGUF file is not installed \(the tiny-plugin-dist"):
        named_models.resolve("tiny-plugin-model")
    with pytest.raises(NamedModelError, match=r"^entry point 'not-a-model' \(kvbench.models: .*\): 42 is not a "):
        MODELS.get("not-a-model")


def test_a_distribution_adds_a_preset(plugin):
    assert "plugin-protocol" in PRESETS.names()
    preset = load_preset("plugin-protocol")
    assert preset.description == "a plugin's protocol" and preset.settings["context_lengths"].values == [4096]
