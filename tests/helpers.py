"""Shared pieces of the plugin tests: the bench files and a small, fast grid."""

from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"

SMALL_GRID = [
    "--kvbench-methods", "full,streamingllm,snapkv",
    "--kvbench-budgets", "32",
    "--kvbench-tasks", "niah_single_1,passage_retrieval_en",
    "--kvbench-context-lengths", "256",
    "--kvbench-samples", "2",
    "--kvbench-max-prompt-tokens", "320",
    "-p", "no:cacheprovider",
]


# Collection only, one budget and one task: enough to see which items a method spec makes.
GRID = ["--collect-only", "-q", "-p", "no:cacheprovider", "--kvbench-budgets", "64",
        "--kvbench-tasks", "passage_retrieval_en"]


def add_bench_files(pytester) -> None:
    """Copy the real benchmark suite into the pytester directory.

    Renamed, because pytester runs in this process, where tests/tasks/test_longbench.py and
    tests/tasks/test_ruler.py are already imported under those module names.
    """
    for path in sorted(BENCH.glob("test_*.py")):
        if path.name != "test_kernels.py":
            pytester.makepyfile(**{"test_suite_" + path.stem[5:]: path.read_text()})


def file_mtimes(root: Path, skip: Path) -> dict[str, int]:
    """Every file under ``root`` but those under ``skip``, with its modification time: what a run wrote
    outside ``skip`` (its results directory) is what changes between two calls."""
    import os

    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if Path(dirpath, d) != skip]
        for name in filenames:
            path = Path(dirpath, name)
            out[str(path)] = path.stat().st_mtime_ns
    return out


def collected_ids(result) -> list[str]:
    """The parametrize ids of a ``--collect-only -q`` run."""
    return [line.split("[", 1)[1].rstrip("]") for line in result.outlines if "::" in line and "[" in line]


HOOK_CONFTEST = (
    "import json\n"
    "def pytest_kvbench_record(record, item):\n"
    "    with open('hook_calls.jsonl', 'a') as f:\n"
    "        f.write(json.dumps({'nodeid': item.nodeid, 'record': record}, default=str) + '\\n')\n"
)


def run_bench(directory, *args, timeout=900, env=None, keep_carriage_returns=False):
    """Run the benchmark suite in a fresh interpreter (as a user would) inside ``directory``.

    A subprocess keeps torch's global registrations out of the test process and lets one run
    serve a whole test module. keep_carriage_returns: the output as written (text mode turns "\r" into "\n").
    """
    import os
    import subprocess
    import sys

    directory.mkdir(parents=True, exist_ok=True)
    for name in ("test_longbench.py", "test_ruler.py"):
        (directory / name).write_text((BENCH / name).read_text())
    if not (directory / "conftest.py").exists():
        (directory / "conftest.py").write_text(HOOK_CONFTEST)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONHASHSEED="0", **(env or {}))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=directory, env=env, capture_output=True, text=not keep_carriage_returns, timeout=timeout)
    if keep_carriage_returns:
        proc.stdout, proc.stderr = proc.stdout.decode(), proc.stderr.decode()
    return proc


def hook_records(directory) -> list[dict]:
    import json

    path = directory / "hook_calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def install_fake_distribution(root: Path, name: str, files: dict[str, bytes]) -> None:
    """A distribution ``name`` under ``root`` (put ``root`` on sys.path) whose RECORD lists these files."""
    info = root / f"{name.replace('-', '_')}-1.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0.0\n")
    (info / "RECORD").write_text("".join(f"{file},,\n" for file in files))
    for file, data in files.items():
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        (root / file).write_bytes(data)
