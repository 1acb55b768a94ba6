"""The --kvbench-* options and kvbench_* ini keys that pytest learns: declared in every pytest run, so light.

pytest calls pytest_addoption in every run of every project where the plugin is installed; this module imports
nothing but pytest, so declaring the options costs no grid, task or result import (plugin.py). What the values
mean, and their checks, are options.py's, once kvbench is used.
"""

from __future__ import annotations

import pytest

DEFAULT_METHODS = ["full", "streamingllm", "h2o", "snapkv", "pyramidkv", "tova", "knorm", "random"]

# name -> (help, ini type); each becomes --kvbench-<name> and the ini key kvbench_<name>.
GRID_OPTIONS: dict[str, tuple[str, str]] = {
    "model": ("model: 'default' (embedded), a named model (kvbench models), a hub id, a local path or a .gguf file; repeat or comma-separate for several", "linelist"),
    "methods": ("methods, comma-separated; parameters as snapkv:window=64:kernel=5 (default: full and 7 eviction "
                "methods: " + ",".join(DEFAULT_METHODS[1:]) + ")", "linelist"),
    "budgets": ("budgets: KV tokens kept per layer per KV head (1024) or fraction removed (r0.5)", "linelist"),
    "tasks": ("tasks, comma-separated (LongBench and RULER names)", "linelist"),
    "samples": ("samples per task (positive integer)", "string"),
    "seed": ("seed of sample generation and of random methods", "string"),
    "seeds": ("several seeds, comma-separated: one item per seed, aggregated into mean and CI", "string"),
    "context-lengths": ("RULER context lengths in tokens, comma-separated", "linelist"),
    "protocol": ("compression protocols, comma-separated: question_in_window, query_agnostic, shared_context, "
                 "multi_turn", "linelist"),
    "dtype": ("model dtype: auto (bfloat16 on CUDA, float32 on CPU), float32, bfloat16, float16", "string"),
    "attn-implementation": ("attention implementation passed to from_pretrained (sdpa, eager, ...)", "string"),
    "data": ("directory of LongBench {task}.jsonl files in the official format ('fixtures' for the shipped ones)", "string"),
    "max-prompt-tokens": ("maximum prompt tokens before middle truncation (default: model maximum - generation length)", "string"),
    "preset": ("a published protocol: kvpress-leaderboard or kvcache-factory-longbench; it sets tasks, context "
               "length, budgets, protocol and samples, and refuses options that contradict it (docs/protocols.md)",
               "string"),
}
GRID_INI_KEYS = tuple("kvbench_" + name.replace("-", "_") for name in GRID_OPTIONS)


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvbench", "KV-cache compression benchmark")
    for name, (help_text, ini_type) in GRID_OPTIONS.items():
        dest = "kvbench_" + name.replace("-", "_")
        if ini_type == "linelist":
            group.addoption(f"--kvbench-{name}", action="append", dest=dest, default=None, help=help_text)
        else:
            group.addoption(f"--kvbench-{name}", action="store", dest=dest, default=None, help=help_text)
        parser.addini(dest, help_text, type=ini_type, default=None)
    group.addoption("--kvbench-config", dest="kvbench_config", default=None,
                    help="TOML grid file (models, methods, budgets, tasks, samples, seed, ...)")
    group.addoption("--kvbench-results", dest="kvbench_results", default=None,
                    help="results directory (default: results/)")
    parser.addini("kvbench_results", "results directory", default="results")
    parser.addini("kvbench_progress_interval", "least seconds between plain progress lines of samples when the "
                  "output is not a terminal (one worker's under -n; default 30; 0: every sample, every fifth "
                  "of an item without -n)", default="30")
    group.addoption("--kvbench-save", dest="kvbench_save", default=None,
                    help="write a baseline file from this run")
    group.addoption("--kvbench-save-force", dest="kvbench_save_force", action="store_true",
                    help="allow --kvbench-save to overwrite an existing file")
    group.addoption("--kvbench-compare", dest="kvbench_compare", default=None,
                    help="baseline file: each item fails on a significant regression")
    group.addoption("--kvbench-compare-fail", dest="kvbench_compare_fail", action="append", default=None,
                    help="tolerance per metric, e.g. score:1.0, latency:20%%, kv_bytes:5%% (default score:1.0)")
    group.addoption("--kvbench-resume", dest="kvbench_resume", default=None,
                    help="run id to complete: only items without a record run")
    group.addoption("--kvbench-shard", dest="kvbench_shard", default=None,
                    help="K/N: run the K-th of N deterministic parts of the grid (grouped by model)")
    group.addoption("--kvbench-allow-oversubscribe", dest="kvbench_allow_oversubscribe", action="store_true",
                    help="allow more xdist workers than GPUs")
    group.addoption("--kvbench-timeout", dest="kvbench_timeout", default=None,
                    help="per-item time limit in seconds")
    group.addoption("--kvbench-torch-threads", dest="kvbench_torch_threads", default=None,
                    help="torch CPU threads per process (e.g. 1 with -n 2 on a 2-core machine)")
    group.addoption("--kvbench-no-share-prefill", dest="kvbench_no_share_prefill", action="store_true",
                    help="prefill every item on its own instead of once per sample for a reference group "
                         "(to time items in isolation)")
