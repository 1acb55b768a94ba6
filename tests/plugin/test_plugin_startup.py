"""The plugin costs nothing until used: no torch, transformers, datasets, scipy, matplotlib or numpy is
imported by a pytest run that loads the plugin but runs no benchmark, nor by collecting the bench grid.

Each run is a fresh interpreter (subprocess): a probe plugin writes, per process (xdist's workers too),
which heavy modules are in sys.modules when pytest unconfigures. Timings are measured by
scripts/measure/measure_startup.py, not here.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kvbench.wiring.distributed.gpu_slots import GPU_DRIVER_PATHS

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "datasets", "scipy", "matplotlib", "numpy", "pandas", "safetensors", "tokenizers",
         "duckdb", "pyarrow", "mlflow", "wandb")  # the last four: the kvbench command's and the trackers' only
# what the benchmark's own plugin (run_plugin.py) brings: the grid, the case model, the task registry, results/
BENCHMARK = ("pytest_kvbench.run_plugin", "pytest_kvbench.cases", "pytest_kvbench.tasks", "pytest_kvbench.results",
             "pytest_kvbench.wiring.grid.options", "pytest_kvbench.wiring.default_selection")
PROBE = f"""
import json, os, sys

def pytest_unconfigure(config):
    with open(os.path.join({{out!r}}, f"{{{{os.getpid()}}}}.json"), "w") as out:
        json.dump({{{{"kvbench": config.pluginmanager.has_plugin("kvbench"),
                    "heavy": sorted(name for name in {HEAVY!r} if name in sys.modules),
                    "benchmark": sorted(name for name in sys.modules if name.startswith({BENCHMARK!r}))}}}}, out)
"""


def probed_pytest(tmp_path: Path, cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    """`python -m pytest ARGS` from `cwd` with the checkout's code and the probe: (process, what its processes
    saw: whether every one loaded the plugin, and the heavy modules any of them imported)."""
    out = tmp_path / "probe"
    out.mkdir(exist_ok=True)
    (out / "heavy_probe.py").write_text(PROBE.format(out=str(out)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(out)]), HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "heavy_probe", "-p", "no:cacheprovider", *args],
                          cwd=cwd, env=env, capture_output=True, text=True)
    seen = [json.loads(path.read_text()) for path in out.glob("*.json")]
    return proc, {"processes": len(seen), "kvbench": all(s["kvbench"] for s in seen),
                  "heavy": sorted({name for s in seen for name in s["heavy"]}),
                  "benchmark": sorted({name for s in seen for name in s["benchmark"]})}


def test_an_unrelated_pytest_run_imports_nothing_heavy(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    proc, seen = probed_pytest(tmp_path, project, "-q", "test_one.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert seen["kvbench"], "the plugin was not loaded, so this test proves nothing"
    assert seen["heavy"] == []
    assert seen["benchmark"] == []  # the benchmark's plugin comes in only when kvbench is used (plugin.py)


def test_a_kvbench_option_or_a_module_using_kvbench_brings_the_benchmark_in(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    _, seen = probed_pytest(tmp_path, project, "-q", "test_one.py", "--kvbench-results", str(tmp_path / "r"))
    assert "pytest_kvbench.run_plugin" in seen["benchmark"] and seen["heavy"] == []
    (project / "test_two.py").write_text("def test_two(kvbench_case):\n    pass\n")  # a benchmark module
    proc, seen = probed_pytest(tmp_path, project, "-q", "--collect-only", "test_one.py", "test_two.py")
    assert "pytest_kvbench.run_plugin" in seen["benchmark"] and seen["heavy"] == []


@pytest.mark.skipif(any(os.path.exists(path) for path in GPU_DRIVER_PATHS),
                    reason="a GPU driver is present: xdist's worker count is checked against torch's GPU count")
def test_an_unrelated_pytest_run_under_xdist_imports_nothing_heavy(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_one.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    proc, seen = probed_pytest(tmp_path, project, "-q", "-p", "xdist", "-n", "2", "test_one.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert seen["processes"] == 3 and seen["kvbench"]  # the controller and two workers
    assert seen["heavy"] == []


def test_collecting_the_bench_grid_imports_no_implementation(tmp_path):
    proc, seen = probed_pytest(tmp_path, ROOT, "bench/", "--collect-only", "-q",
                               "--kvbench-methods", "full,snapkv,h2o,pyramidkv,streamingllm,kvzip,expected_attention",
                               "--kvbench-torch-threads", "1", "--kvbench-results", str(tmp_path / "results"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "snapkv-128-" in proc.stdout  # the grid was collected
    assert seen["heavy"] == []


def test_a_bad_grid_is_still_refused_at_configure_without_heavy_imports(tmp_path):
    proc, seen = probed_pytest(tmp_path, ROOT, "bench/", "--collect-only", "-q",
                               "--kvbench-methods", "snapkv:kernel=4", "--kvbench-results", str(tmp_path / "results"))
    assert proc.returncode == 4
    assert "snapkv: parameter 'kernel' must be odd, got 4" in proc.stderr
    assert seen["heavy"] == []


def test_importing_the_plugin_or_the_kvbench_command_imports_no_database_or_tracker():
    """DuckDB and pyarrow are the `kvbench query` verb's, mlflow and wandb the trackers' (wiring/trackers/), imported
    when used: neither the pytest11 entry point nor the console script imports them."""
    code = ("import sys, pytest_kvbench.plugin, pytest_kvbench.cli; "
            "print(sorted(m for m in ('duckdb', 'pyarrow', 'mlflow', 'wandb') if m in sys.modules))")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
