"""A task or suite named in -k / -m selects from every task the registry knows (wiring/grid/named_tasks.py).

`pytest bench/ -k "snapkv and qasper"` collected nothing on a fresh install (exit 5): -k only chose among the
default grid's tasks. Names that are no task (snapkv, smoke) must leave the grid as it was."""

import shutil

import pytest

from helpers import collected_ids
from pytest_kvbench.engine.models import DEFAULT_MODEL_DIR
from pytest_kvbench.tasks import available_tasks, runnable
from pytest_kvbench.tasks.packaged import has_packaged_data
from pytest_kvbench.wiring.grid import command_line
from pytest_kvbench.wiring.grid.named_tasks import identifiers, tasks_named

DEFAULT_TASKS = runnable(command_line.DEFAULT_TASKS)  # the default grid, as configure resolves it
SMOKE_TASKS = runnable(command_line.SMOKE_TASKS)

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

ONE_METHOD = ["--kvbench-methods", "full,snapkv", "--kvbench-budgets", "128"]


def test_identifiers_are_the_names_the_user_wrote():
    assert identifiers("snapkv and not (qasper or H2O)") == ["snapkv", "qasper", "h2o"]
    assert identifiers("ruler and parametrize(reason='x=1')") == ["ruler", "parametrize"]
    assert identifiers(None) == [] and identifiers("") == []


def test_a_keyword_names_the_tasks_it_matches_and_a_suite_all_of_its_tasks():
    assert tasks_named("snapkv and qasper", None) == ["qasper", "qasper_e"]  # substring, as -k matches
    assert tasks_named("snapkv-128-qasper", None) == ["qasper"]  # an item id names its task
    assert tasks_named(None, "infinitebench") == available_tasks("infinitebench")
    assert tasks_named("ruler", None) == available_tasks("ruler")  # a suite is a marker, so a keyword too
    assert tasks_named("snapkv or h2o", "smoke") == []


def test_the_first_example_collects_its_task(bench):
    """The design card's first example, offline on a fresh install: qasper runs from its packaged fixture."""
    assert "qasper" not in DEFAULT_TASKS and has_packaged_data("qasper")
    result = bench.runpytest("--collect-only", "-q", "-k", "snapkv and qasper")
    assert sorted(collected_ids(result)) == ["snapkv-128-qasper", "snapkv-256-qasper"]
    header = bench.runpytest("--collect-only", "-k", "snapkv and qasper").stdout.str()
    assert "added: qasper" in header
    assert "cannot run here, not added: qasper_e" in header  # LongBench-E ships no fixture: said, not collected


def test_a_suite_marker_collects_every_packaged_task_of_the_suite(bench):
    ids = collected_ids(bench.runpytest("--collect-only", "-q", *ONE_METHOD, "-m", "infinitebench"))
    tasks = available_tasks("infinitebench")
    assert all(has_packaged_data(task) for task in tasks)
    assert sorted(ids) == sorted(f"{method}-{task}" for task in tasks for method in ("full", "snapkv-128"))


def test_tasks_without_packaged_data_join_only_where_data_can_come_from(bench, tmp_path, monkeypatch):
    """RULER's qa_1 reads SQuAD from the hub: not added on the packaged fixtures; for another model added where the
    hub can be asked or the data directory holds squad.json, and not offline with no copy cached (it could only
    skip: `pytest bench/ -m ruler` then selects the 11 RULER tasks that run offline)."""
    result = bench.runpytest("--collect-only", "-q", *ONE_METHOD, "-k", "qa_1")
    assert collected_ids(result) == []
    assert "cannot run here, not added: qa_1" in bench.runpytest("--collect-only", *ONE_METHOD, "-k", "qa_1").stdout.str()
    model_dir = tmp_path / "other"
    shutil.copytree(DEFAULT_MODEL_DIR, model_dir)  # another model: its data would come from the hub
    other = [*ONE_METHOD, "-k", "qa_1", "--kvbench-model", str(model_dir)]
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    assert sorted(collected_ids(bench.runpytest("--collect-only", "-q", *other))) == [
        "full-qa_1-ctx2048", "snapkv-128-qa_1-ctx2048"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("HF_HUB_CACHE", "HF_DATASETS_CACHE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf_home"))  # nothing cached
    assert "cannot run here, not added: qa_1" in bench.runpytest("--collect-only", *other).stdout.str()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "squad.json").write_text("{}")
    result = bench.runpytest("--collect-only", "-q", *other, "--kvbench-data", str(tmp_path / "data"))
    assert sorted(collected_ids(result)) == ["full-qa_1-ctx2048", "snapkv-128-qa_1-ctx2048"]


@pytest.mark.parametrize("select", [["-m", "smoke"], ["-k", "snapkv"]])
def test_names_that_are_no_task_leave_the_grid_as_it_was(bench, select):
    ids = collected_ids(bench.runpytest("--collect-only", "-q", *ONE_METHOD, *select))
    expected = SMOKE_TASKS if select[0] == "-m" else DEFAULT_TASKS
    methods = ("full", "snapkv-128") if select[0] == "-m" else ("snapkv-128",)
    suffix = {task: "-ctx2048" if task.startswith(("niah", "vt")) else "" for task in expected}
    assert sorted(ids) == sorted(f"{method}-{task}{suffix[task]}" for task in expected for method in methods)


def test_a_task_list_is_the_grid_as_given(bench):
    result = bench.runpytest("--collect-only", "-q", *ONE_METHOD, "--kvbench-tasks", "passkey", "-k", "qasper")
    assert collected_ids(result) == []
    assert "added" not in bench.runpytest("--collect-only", *ONE_METHOD, "--kvbench-tasks", "passkey",
                                          "-k", "qasper").stdout.str()
