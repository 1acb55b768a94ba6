"""The ``--kvbench-*`` options and ``kvbench_*`` ini keys pytest learns, the form of the values given, and the
default grid's methods and tasks (by name: the task registry drops those it cannot run, at configure).

Registered in pytest_addoption; checked first at configure, before any value is resolved (options.py): a blank
value, a one-value option typed twice with two values, a malformed ``--kvbench-shard``. pytest declares the
options in every run of every project where the plugin is installed, so this module imports nothing of the
grid, the tasks or results (plugin.py).
"""

from __future__ import annotations

import pytest

from pytest_kvbench.input_values import InputError as GridError  # cases.GridError, without the case model
from pytest_kvbench.input_values import parse_shard, shown_list
from pytest_kvbench.wiring.grid import tracker_options

# full, seven eviction methods and a quantizer (kivi: every method family the product ships has a row of the main
# job's table and an item of the smoke gate; it runs at options.DEFAULT_STORAGE_BUDGETS, a byte budget)
DEFAULT_METHODS = ["full", "streamingllm", "h2o", "snapkv", "pyramidkv", "tova", "knorm", "random", "kivi"]

# The default grid's tasks (the embedded-model main job) and its smoke subset, as named on the command line; the
# task registry drops those whose suite misses an optional dependency (tasks/registry.runnable) at configure.
# The main job's tasks: the retrieval-style RULER tasks
# that need no external text (what the embedded model was trained for), the short-answer
# LongBench tasks that have packaged fixtures, and one fixture task of each further suite.
# Aggregation tasks (cwe, fwe) and long-generation tasks (gov_report, samsum, qasper) are
# available by name; they cost minutes on a CPU and the embedded model cannot do them, so they
# are not in the default grid.
# The smoke subset is also the CI gate (results/baseline-smoke.json): its RULER and LongBench tasks are those where
# the embedded model gives the gate power at the smallest budget (niah_single_1: the full cache scores 100 and every
# method's KL to it is far from 0; lcc: a graded score strictly between 0 and 100), and one fixture task of each
# further suite keeps every suite running end to end (those entries can fail only by an error: the gate warns,
# docs/baselines.md).
SMOKE_TASKS = ("niah_single_1", "lcc", "longbench_v2", "passkey", "aime2024:max_new_tokens=64", "scbench_vt")
DEFAULT_TASKS = (
    "niah_single_1", "niah_multikey_2", "niah_multikey_3", "vt",
    "passage_retrieval_en", "hotpotqa", "trec", "lcc",
    "longbench_v2", "passkey", "aime2024:max_new_tokens=64", "scbench_vt",
)

# name -> (help, ini type); each becomes --kvbench-<name> and the ini key kvbench_<name>.
GRID_OPTIONS: dict[str, tuple[str, str]] = {
    "model": ("model: 'default' (embedded), a named model (kvbench models), a hub id, a local path or a .gguf file; repeat or comma-separate for several", "linelist"),
    "methods": ("methods, comma-separated; parameters as snapkv:window=64:kernel=5 (default: full, 7 eviction "
                "methods: " + ",".join(DEFAULT_METHODS[1:-1]) + ", and the quantizer " + DEFAULT_METHODS[-1] + ")",
                "linelist"),
    "budgets": ("budgets: KV tokens kept per layer per KV head (1024), fraction removed (r0.5) or byte fraction "
                "(m0.25); default 128,256, and m0.125 for a method that evicts nothing (a quantizer)", "linelist"),
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
    "sliding": ("sliding-window layers (gemma2/3, gpt-oss, cohere2, mistral with a window): keep (default: kept as "
                "their window) or compress (compressed to the method's budget too); docs/models.md", "string"),
    "measure-alone": ("how often a method's own decode speed is measured, one sample decoded alone (batch 1) "
                      "while the others batch: item (default: each item's first sample) or method (the first "
                      "sample of each method, budget, context length and protocol in each worker; the real-model "
                      "jobs, whose tasks share a length); docs/batched-decoding.md", "string"),
    "preset": ("a published evaluation's settings: kvpress-leaderboard or kvcache-factory-longbench; it sets tasks, "
               "context length, budgets, protocol and samples, and refuses options that contradict it "
               "(docs/official-evaluations.md)", "string"),
}

# Every ini key with its default: one set to anything else says kvbench is used (plugin.py)
INI_DEFAULTS = {**{"kvbench_" + name.replace("-", "_"): None for name in GRID_OPTIONS},
                "kvbench_results": "results", "kvbench_progress_interval": "30", **tracker_options.INI_DEFAULTS}

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
    parser.addini("kvbench_results", "results directory", default=INI_DEFAULTS["kvbench_results"])
    parser.addini("kvbench_progress_interval", "least seconds between plain progress lines of samples when the "
                  "output is not a terminal (one worker's under -n; default 30; 0: every sample, every fifth "
                  "of an item without -n)", default=INI_DEFAULTS["kvbench_progress_interval"])
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
                    help="torch CPU threads per process (default: torch's; an xdist worker takes its share of "
                         "the cores unless OMP_NUM_THREADS is set)")
    group.addoption("--kvbench-no-share-prefill", dest="kvbench_no_share_prefill", action="store_true",
                    help="prefill every item on its own instead of once per sample for a reference group "
                         "(to time items in isolation)")
    tracker_options.add_options(parser, group)


def check_given_options(config: pytest.Config) -> None:
    """Every ``--kvbench-*`` value given on the command line: none blank, alone or repeated
    (``--kvbench-save ''``, ``--kvbench-model X --kvbench-model ''``), since an empty value used to be
    read as "unset" and silently dropped; ``--kvbench-shard`` well formed. Runs before anything else."""
    for dest, value in sorted(vars(config.option).items()):
        if not dest.startswith("kvbench_") or isinstance(value, bool) or value is None:
            continue
        option = "--" + dest.replace("_", "-")
        for given in value if isinstance(value, list) else [value]:
            if isinstance(given, str) and not given.strip():
                raise GridError(f"{option} is empty; give a value or leave the option out")
        if isinstance(value, str):
            _check_given_once(option, config.invocation_params.args)
    shard = config.getoption("kvbench_shard")
    if shard is not None:
        try:
            parse_shard(shard)
        except ValueError as exc:
            raise GridError(str(exc)) from None


def _check_given_once(option: str, args) -> None:
    """A one-value option typed twice with two values (``--kvbench-preset A --kvbench-preset B``) is refused:
    argparse keeps the last without a word. Only the command line counts: it may override ini addopts."""
    args, values = [str(arg) for arg in args], []
    for i, arg in enumerate(args):
        if arg.startswith(option + "="):
            values.append(arg.split("=", 1)[1])
        elif arg == option and i + 1 < len(args):
            values.append(args[i + 1])
    if len(set(values)) > 1:
        times = "twice" if len(values) == 2 else f"{len(values)} times"
        raise GridError(f"{option} given {times} ({' and '.join(map(shown_list, values))}); it takes one value: "
                        f"give it once")
