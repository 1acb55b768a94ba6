"""Fixtures shared by the plugin tests: one small real run, reused by every module that reads it.

The engine and every method implementation are imported here, before any in-process pytester run: the
plugin imports none of them at load, and pytester drops the modules first imported inside a run, which
torch's C extension does not survive (importing it again re-registers its operator libraries and fails).
"""

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

import pytest_kvbench.engine.runner  # noqa: F401 (see above)

# tests/ mirrors the packages in subfolders; their shared helpers (helpers.py, model_helpers.py, ...) live here.
# Put on sys.path for the tests only: pytest's `pythonpath` ini key would also apply to `pytest bench/`, where
# tests/kvmethods/ (no __init__.py) would shadow the installed kvmethods package as a namespace package.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from helpers import SMALL_GRID, add_bench_files, run_bench  # noqa: E402
from kvmethods.core.catalog import BUILTINS

for _entry in BUILTINS.values():
    importlib.import_module(_entry.module)


def _import_family_modeling_modules() -> None:
    """Every test family's transformers modeling module, imported before any in-process pytester run. pytester drops
    the modules first imported during a test, but transformers' auto mappings keep the model classes they loaded,
    and a class whose module is gone from sys.modules cannot change its attention implementation
    (PreTrainedModel._can_set_attn_implementation reads the module's source, and says no without one): a later
    test's query capture then saw no queries (deepseek_v3's nine MLA tests failed in CI whenever
    tests/plugin/test_startup_probes.py's deepseek test ran first in the same worker)."""
    from kvmethods.testing import FAMILIES
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    for family in FAMILIES:  # gemma3_text's module is also the gemma3 GGUF model's
        MODEL_FOR_CAUSAL_LM_MAPPING[CONFIG_MAPPING[family]]


_import_family_modeling_modules()

INDEPENDENT = "transformers_independent"


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        f"{INDEPENDENT}: the test's outcome cannot depend on the transformers version (the plugin's session logic: "
        "progress, interrupts, faults, shards, the gate, tables, the kvbench command); CI's second environment "
        "(.ci/kvpress-env.sh, transformers 5.2) deselects it with -m 'not " + INDEPENDENT + "'. Leave it off a test "
        "that loads or runs a model through transformers in a way not already covered by an unmarked test, reads "
        "a config, tokenizer or attention registry, or imports kvpress.")
    # hypothesis's pytest plugin counts itself into 'initialization' when it is imported and out at session start; a
    # pytester in-process run that ends in a usage error (the bad-input tests) imports it again and never starts a
    # session, so every strategy drawn later in that worker warned 'Slow code in plugin' (~7,000 lines in CI's log,
    # above the failures). Nothing is slow there: the count is off.
    config.addinivalue_line("filterwarnings", "ignore:Slow code in plugin")
    # A pytester in-process session inside an xdist worker (test_distributed's --collect-only runs) configures
    # pytest-benchmark, which sees the worker's xdist and warns into this session that it disables benchmarks: true of
    # the inner session, which collects only; nothing of ours is benchmarked there.
    config.addinivalue_line("filterwarnings", "ignore:Benchmarks are automatically disabled because xdist plugin is active")
    if config.getoption("numprocesses", None) or os.environ.get("PYTEST_XDIST_WORKER"):
        one_torch_thread_per_worker()


def one_torch_thread_per_worker() -> None:
    """Under -n (README's `pytest tests/ -n auto`: a worker per core), each worker computes with one torch thread, and
    so does every benchmark a test starts in a subprocess (OMP_NUM_THREADS, which the workers started after this and
    the subprocesses inherit). torch's default, a thread per core in every process, put 4 spinning OpenMP threads on
    2 cores: tests/kvmethods/test_families.py -n 2 took 193 CPU s that way, 54 with one thread each. An
    OMP_NUM_THREADS already set is kept."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Under -n, a test module goes to one worker whole (loadscope; xdist's default `load` splits modules), so a
    module- or session-scoped fixture that runs a benchmark (most of tests/plugin/) runs once, not once per worker.
    An explicit --dist other than load is kept."""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    return LoadScopeScheduling(config, log)


@pytest.fixture
def bench(pytester):
    """A pytester directory holding the real benchmark suite."""
    add_bench_files(pytester)
    return pytester


@pytest.fixture(scope="session")
def small_run(tmp_path_factory, worker_id):
    """A real benchmark run of the small grid without xdist: (workdir, process, results dir, its folder), read-only.

    Under -n it is made once for the whole session, not once per worker that needs it (four modules do): the first
    worker to ask makes it in the session's folder shared by the workers, under a file lock; the others wait and
    read it."""
    if worker_id == "master":
        return _small_run(tmp_path_factory.mktemp("small_run"))
    base = tmp_path_factory.getbasetemp().parent / "small_run"
    with FileLock(f"{base}.lock"):
        if not (base / "proc.json").exists():
            proc = _small_run(base)[1]
            (base / "proc.json").write_text(json.dumps([proc.args, proc.returncode, proc.stdout, proc.stderr]))
    proc = subprocess.CompletedProcess(*json.loads((base / "proc.json").read_text()))
    return base / "work", proc, base / "res", base


def _small_run(base: Path):
    results = base / "res"
    proc = run_bench(base / "work", *SMALL_GRID, "--kvbench-results", str(results), f"--junitxml={base / 'j.xml'}")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return base / "work", proc, results, base
