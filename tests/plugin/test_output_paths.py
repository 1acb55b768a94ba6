"""Every path a run writes is checked at startup, and a write that fails at the end is one line (issue 31, item 2).

Tests may run as root, where ``chmod`` stops nothing, so paths are made unwritable in ways that stop
root too: a path under a regular file, a directory where a file must be written (and the reverse),
a folder replaced by a file while the run goes on, and a full disk (ENOSPC raised by the write
itself, from a conftest of the run). The chmod case runs only for a user it stops.
"""

from __future__ import annotations

import json
import struct
import os
import subprocess
import sys
from pathlib import Path

import pytest
# Imported here, outside pytester's runs: pytester drops the modules a run imports when it ends,
# and transformers' lazy modules cannot be imported a second time into the same process.
from transformers import AttentionInterface, AutoConfig  # noqa: F401
from helpers import add_bench_files, run_bench

from pytest_kvbench.engine import models
from pytest_kvbench.model_sources.embedded import DEFAULT_MODEL_DIR
from pytest_kvbench.results.run import storage
from pytest_kvbench.wiring.grid import model_refs
from pytest_kvbench.cases import GridError

GRID = ["--kvbench-methods", "full", "--kvbench-budgets", "32", "--kvbench-tasks", "passage_retrieval_en",
        "--kvbench-samples", "1", "--kvbench-max-prompt-tokens", "200", "--kvbench-torch-threads", "1",
        "-p", "no:cacheprovider"]


@pytest.fixture
def bench(pytester, monkeypatch):
    add_bench_files(pytester)
    (pytester.path / "a_file").write_text("keep me\n")
    monkeypatch.setattr(models.ModelCache, "_load", lambda self, *a: pytest.fail("a model loaded"))
    return pytester


def assert_refused_at_startup(bench, *args: str) -> str:
    result = bench.runpytest_inprocess(*GRID, *args)
    err = result.stderr.str()
    lines = [line for line in err.splitlines() if line.strip()]
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()[-2000:] + err
    assert len(lines) == 1 and lines[0].startswith("ERROR: ") and "Traceback" not in err, err
    assert (bench.path / "a_file").read_text() == "keep me\n"
    return lines[0]


@pytest.mark.parametrize("layout, args, named", [
    ("runs is a file", ["--kvbench-results", "res"], "results directory res/runs: is a file, not a directory"),
    ("RESULTS.md is a directory", ["--kvbench-results", "res"], "results table res/RESULTS.md: is a directory"),
    ("baseline under a file", ["--kvbench-save", "a_file/base.json"], "a parent of it is a file"),
    ("baseline is a directory", ["--kvbench-save", "res"], "is a directory, not a file"),
])
def test_an_output_path_that_cannot_be_written_is_refused_before_any_model_loads(bench, layout, args, named):
    res = bench.path / "res"
    res.mkdir()
    if layout == "runs is a file":
        (res / "runs").write_text("keep me\n")
    if layout == "RESULTS.md is a directory":
        (res / "RESULTS.md").mkdir()
    line = assert_refused_at_startup(bench, *args)
    assert named in line, line
    assert not list(res.glob("runs/*"))


@pytest.mark.skipif(os.geteuid() == 0, reason="chmod does not stop root (the other cases here do)")
def test_a_read_only_results_directory_is_refused_before_any_model_loads(bench):
    res = bench.path / "res"
    res.mkdir()
    res.chmod(0o555)
    try:
        assert "not writable" in assert_refused_at_startup(bench, "--kvbench-results", "res")
    finally:
        res.chmod(0o755)


# -- the model reference ----------------------------------------------------------------------------------


def model_folder(tmp_path, *names):
    folder = tmp_path / "model"
    folder.mkdir()
    for name in names:
        (folder / name).write_bytes((DEFAULT_MODEL_DIR / name).read_bytes())
    return folder


@pytest.mark.parametrize("files, named", [
    (["config.json"], "no weights (model.safetensors, pytorch_model.bin"),
    (["config.json"], "and no tokenizer (tokenizer.json"),
    (["config.json", "model.safetensors"], "but no tokenizer"),
    (["config.json", "tokenizer.json"], "but no weights"),
])
def test_a_model_folder_without_weights_or_tokenizer_is_refused(tmp_path, files, named):
    folder = model_folder(tmp_path, *files)
    with pytest.raises(GridError, match="has a config.json but") as refused:
        model_refs.check_model_reference(str(folder))
    assert named in str(refused.value)


def test_a_sharded_checkpoint_needs_every_shard(tmp_path):
    folder = model_folder(tmp_path, "config.json", "tokenizer.json")
    shards = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shards}))
    empty = struct.pack("<Q", 2) + b"{}"  # a whole safetensors file holding no tensor
    (folder / shards["a"]).write_bytes(empty)
    with pytest.raises(GridError, match=r"1 of the 2 shards model.safetensors.index.json names are missing "
                                        r"\(model-00002-of-00002.safetensors"):
        model_refs.check_model_reference(str(folder))
    (folder / shards["b"]).write_bytes(empty)
    assert model_refs.check_model_reference(str(folder)) == 16384  # whole (only the config is read): its length


def test_a_whole_model_folder_passes(tmp_path):
    folder = model_folder(tmp_path, "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
    assert model_refs.check_model_reference(str(folder)) is not None


def test_a_model_folder_without_weights_stops_pytest_at_startup(bench, tmp_path):
    folder = model_folder(tmp_path, "config.json")
    line = assert_refused_at_startup(bench, "--kvbench-model", str(folder), "--kvbench-data", "fixtures")
    assert "no weights" in line and "no tokenizer" in line


def _available(name: str) -> bool:
    import transformers.utils

    return getattr(transformers.utils, name)()


@pytest.mark.skipif(_available("is_flash_attn_2_available"), reason="flash-attn is installed here, with a GPU")
def test_flash_attention_without_flash_attn_is_refused_at_startup(bench):
    line = assert_refused_at_startup(bench, "--kvbench-attn-implementation", "flash_attention_2")
    assert "flash_attention_2: not available here" in line and "flash-attn package" in line


@pytest.mark.skipif(_available("is_kernels_available"), reason="the kernels package is installed here")
def test_a_hub_kernel_without_the_kernels_package_is_refused(bench):
    line = assert_refused_at_startup(bench, "--kvbench-attn-implementation", "kernels-community/flash-attn")
    assert "kernels package" in line


# -- writes that fail at the end of a run ----------------------------------------------------------------

BREAK_OUTPUTS = (
    "import errno, os, shutil\n"
    "from pytest_kvbench import atomic_files\n"
    "real_write = atomic_files.atomic_write_text\n"
    "def full_disk(path, text, *make_parents):\n"
    "    if os.path.basename(path) == 'run.json':\n"
    "        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))\n"
    "    return real_write(path, text, *make_parents)\n"
    "atomic_files.atomic_write_text = full_disk  # the disk is full when run.json is written\n"
    "def pytest_runtest_logfinish(nodeid, location):  # after the item: taken away while the run went on\n"
    "    os.makedirs('res/RESULTS.md', exist_ok=True)\n"
    "    shutil.rmtree('saved', ignore_errors=True)\n"
    "    open('saved', 'w').close()\n"
)


@pytest.fixture(scope="module")
def broken_end(tmp_path_factory):
    work = tmp_path_factory.mktemp("broken_end")
    (work / "conftest.py").write_text(BREAK_OUTPUTS)
    (work / "saved").mkdir()
    proc = run_bench(work, *GRID, "--kvbench-results", "res", "--kvbench-save", "saved/base.json")
    return work, proc


def test_failed_writes_at_the_end_are_one_line_naming_each_path_and_what_was_kept(broken_end):
    work, proc = broken_end
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out and "INTERNALERROR" not in out, out[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("kvbench: not written:")]
    assert len(lines) == 1, out[-3000:]
    line = lines[0]
    assert "run.json (res/runs/" in line and "run.json: no space left on device)" in line
    assert "RESULTS.md of the results directory (res/RESULTS.md: is a directory)" in line
    assert "baseline (cannot save baseline saved/base.json: a parent of it is a file" in line
    assert "; kept: res/runs/" in line and "records.jsonl (1 record), the run's RESULTS.md" in line


def test_the_records_written_before_the_failure_are_kept_and_readable(broken_end):
    work, _ = broken_end
    (run_dir,) = (work / "res" / "runs").iterdir()
    assert [r["status"] for r in storage.read_records(run_dir / storage.RECORDS_FILE)] == ["passed"]
    assert not (run_dir / storage.RUN_FILE).exists() and (run_dir / "RESULTS.md").is_file()
    show = subprocess.run([sys.executable, "-m", "pytest_kvbench.cli", "show", run_dir.name, "--results", "res"],
                          cwd=work, capture_output=True, text=True, timeout=120)
    assert show.returncode == 0, show.stderr
    assert f"run {run_dir.name} (incomplete: no run.json" in show.stdout and "full-passage_retrieval_en" in show.stdout


FULL_DISK_AT_SECOND_RECORD = (
    "import errno, os\n"
    "from pytest_kvbench.results.run import storage\n"
    "real_append, appended = storage.append_record, []\n"
    "def full_disk(path, record, *amend):\n"
    "    appended.append(record)\n"
    "    if len(appended) > 1:\n"
    "        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))\n"
    "    return real_append(path, record, *amend)\n"
    "storage.append_record = full_disk\n"
)


def test_a_record_that_cannot_be_appended_stops_the_run_in_one_line_keeping_the_others(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "conftest.py").write_text(FULL_DISK_AT_SECOND_RECORD)
    grid = [v if v != "full" else "full,streamingllm,snapkv" for v in GRID]
    proc = run_bench(work, *grid, "--kvbench-results", "res")
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and "INTERNALERROR" not in out, out[-3000:]
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out[-3000:]
    assert "Interrupted: kvbench: the record of streamingllm-32-passage_retrieval_en could not be written to " \
           "res/runs/" in out and "(no space left on device); the records before it are kept" in out
    (run_dir,) = (work / "res" / "runs").iterdir()
    assert [r["item_id"] for r in storage.read_records(run_dir / storage.RECORDS_FILE)] == ["full-passage_retrieval_en"]
    run = json.loads((run_dir / storage.RUN_FILE).read_text())
    assert run["complete"] is False and "--kvbench-resume" in run["resume_command"]
    assert [u["item_id"] for u in run["unfinished"]] == ["streamingllm-32-passage_retrieval_en",
                                                         "snapkv-32-passage_retrieval_en"]


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
def test_a_results_directory_the_filesystem_refuses_is_refused_at_startup(bench):
    """access() says yes to root everywhere; /proc refuses to make a folder all the same (a real probe)."""
    line = assert_refused_at_startup(bench, "--kvbench-results", "/proc/kvbench-results")
    assert "/proc/kvbench-results" in line and "cannot create it in /proc" in line
