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


def add_bench_files(pytester) -> None:
    """Copy the real benchmark suite into the pytester directory."""
    for name in ("test_longbench.py", "test_ruler.py"):
        pytester.makepyfile(**{name[:-3]: (BENCH / name).read_text()})
