"""Command-line options, ini keys and the TOML grid file, resolved into one validated Grid.

Precedence: command line > ``--kvbench-config`` TOML file > ``[tool.pytest.ini_options]`` ini
keys > built-in defaults for the embedded model. Every value is validated here, at configure
time, so bad input stops pytest with a usage error before any model or dataset loads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from pytest_kvbench.wiring.protocols import check_decoding_intervals, check_tasks_serve_protocols, parse_protocols
from pytest_kvbench.wiring.grid import (
    DEFAULT_MODEL,
    Grid,
    GridError,
    MethodSpec,
    parse_positive_int,
    parse_seed,
    split_list,
)

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_METHODS = ["full", "streamingllm", "h2o", "snapkv", "pyramidkv", "tova", "knorm", "random"]
DEFAULT_BUDGETS = ["128", "256"]
DEFAULT_SAMPLES = 20

# name -> (help, ini type); each becomes --kvbench-<name> and the ini key kvbench_<name>.
GRID_OPTIONS: dict[str, tuple[str, str]] = {
    "model": ("model: 'default' (embedded), a hub id or a local path; repeat or comma-separate for several", "linelist"),
    "methods": ("methods, comma-separated; parameters as snapkv:window=64:kernel=5", "linelist"),
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
}

TOML_KEYS = {"models", "model", "methods", "budgets", "tasks", "samples", "seed", "seeds",
             "context_lengths", "protocol", "dtype", "attn_implementation", "data", "max_prompt_tokens"}


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


def _cli(config: pytest.Config, name: str) -> Any:
    return config.getoption("kvbench_" + name.replace("-", "_"))


def _ini(config: pytest.Config, name: str) -> Any:
    value = config.getini("kvbench_" + name.replace("-", "_"))
    return value or None


def load_grid_file(path: str) -> dict:
    """Read a TOML grid file; its keys may sit at top level or under [kvbench]."""
    file = Path(path)
    if not file.is_file():
        raise GridError(f"grid file {path}: not found")
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise GridError(f"grid file {path}: malformed TOML ({exc})") from None
    data = data.get("kvbench", data)
    unknown = sorted(set(data) - TOML_KEYS)
    if unknown:
        raise GridError(f"grid file {path}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(TOML_KEYS))}")
    return data


def _flat_params(params: dict, prefix: str = "") -> dict:
    """Nested tables (a kvpress wrapper's inner press) as the CLI's dotted keys: press = {name = "X", w = 1}
    -> press=X, press.w=1."""
    flat: dict = {}
    for key, value in params.items():
        if isinstance(value, dict):
            if "name" not in value:
                raise GridError(f"grid file: nested method table {prefix}{key} has no name")
            flat[prefix + key] = value["name"]
            flat.update(_flat_params({k: v for k, v in value.items() if k != "name"}, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def _toml_methods(value: Any) -> list[Any]:
    """TOML methods: strings, or tables like {name = "snapkv", window = 64}."""
    out: list[Any] = []
    for entry in value if isinstance(value, list) else [value]:
        if isinstance(entry, dict):
            params = _flat_params({k: v for k, v in entry.items() if k != "name"})
            if "name" not in entry:
                raise GridError(f"grid file: method table {entry} has no name")
            out.append(MethodSpec(str(entry["name"]), tuple(sorted((k, str(v)) for k, v in params.items()))))
        else:
            out.extend(split_list(entry))
    return out


def resolve_grid(config: pytest.Config) -> Grid:
    """Merge the three sources and validate; GridError (one line) on anything unusable."""
    file_values: dict = {}
    config_path = config.getoption("kvbench_config")
    if config_path:
        file_values = load_grid_file(config_path)

    def pick(name: str) -> Any:
        cli = _cli(config, name)
        if cli not in (None, []):
            return cli
        key = name.replace("-", "_")
        if key in file_values:
            return file_values[key]
        if key == "model" and "models" in file_values:
            return file_values["models"]
        return _ini(config, name)

    grid = Grid()
    grid.models = [str(m) for m in split_list(pick("model"))] or [DEFAULT_MODEL]
    if _cli(config, "methods"):
        methods = split_list(_cli(config, "methods"))
    elif "methods" in file_values:
        methods = _toml_methods(file_values["methods"])
    else:
        methods = split_list(_ini(config, "methods"))
    grid.methods = [m if isinstance(m, MethodSpec) else MethodSpec.parse(str(m)) for m in methods] or [
        MethodSpec(name) for name in DEFAULT_METHODS
    ]
    grid.budgets = [str(b).strip() for b in split_list(pick("budgets"))] or list(DEFAULT_BUDGETS)
    grid.tasks = [str(t) for t in split_list(pick("tasks"))]
    samples = pick("samples")
    grid.samples = parse_positive_int(samples, "--kvbench-samples") if samples is not None else DEFAULT_SAMPLES
    seeds = pick("seeds")
    if seeds is not None:
        grid.seeds = [parse_seed(s) for s in split_list(seeds)] or [0]
    else:
        seed = pick("seed")
        grid.seeds = [parse_seed(seed)] if seed is not None else [0]
    lengths = split_list(pick("context-lengths"))
    grid.context_lengths = [parse_positive_int(x, "--kvbench-context-lengths") for x in lengths]
    protocol = pick("protocol")
    if protocol is not None:
        grid.protocols = parse_protocols(protocol)
    grid.dtype = str(pick("dtype") or "auto")
    if grid.dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise GridError(f"unknown dtype {grid.dtype!r}; valid: auto, float32, bfloat16, float16")
    grid.attn_implementation = str(pick("attn-implementation") or "sdpa")
    data = pick("data")
    grid.data_dir = str(data) if data else None
    max_prompt = pick("max-prompt-tokens")
    grid.max_prompt_tokens = parse_positive_int(max_prompt, "--kvbench-max-prompt-tokens") if max_prompt else None
    _validate(grid)
    return grid


def _validate(grid: Grid) -> None:
    """Names, budgets and paths checked against the registries, still without loading a model."""
    from kvmethods import Budget, MethodError, get_method

    from pytest_kvbench import tasks as task_registry

    for spec in grid.methods:  # get_method names the valid methods for an unknown one
        try:
            get_method(spec.name, **dict(spec.params))
        except MethodError as exc:
            raise GridError(str(exc)) from None
    parsed = []
    for budget in grid.budgets:
        try:
            parsed.append(Budget.parse(budget))
        except MethodError as exc:
            raise GridError(f"--kvbench-budgets: {exc}") from None
    grid.budgets = parsed
    tasks_named = bool(grid.tasks)
    if not grid.tasks:
        grid.tasks = list(task_registry.DEFAULT_TASKS)
        grid.smoke_tasks = list(task_registry.SMOKE_TASKS)
    else:
        grid.smoke_tasks = [t for t in grid.tasks if t in task_registry.SMOKE_TASKS]
    for task in grid.tasks:
        try:
            task_registry.get_task(task)
        except task_registry.TaskError as exc:
            raise GridError(str(exc)) from None
    check_tasks_serve_protocols(grid, tasks_named)
    check_decoding_intervals(grid)
    if not grid.context_lengths:
        grid.context_lengths = [task_registry.DEFAULT_CONTEXT_LENGTH]
    for model in grid.models:
        check_model_reference(model)
    if grid.data_dir is None and grid.models == [DEFAULT_MODEL]:
        grid.data_dir = "fixtures"  # the embedded model runs on the shipped fixture data, never the hub
    if grid.data_dir and grid.data_dir != "fixtures" and not Path(grid.data_dir).is_dir():
        raise GridError(f"--kvbench-data {grid.data_dir}: not a directory")


def check_model_reference(model: str) -> None:
    """A local path must exist; a hub id must be cached when the hub is offline."""
    if model == DEFAULT_MODEL:
        return
    looks_local = model.startswith((".", "/", "~")) or os.path.exists(model) or model.count("/") > 1
    if looks_local:
        path = Path(model).expanduser()
        if not (path / "config.json").is_file():
            raise GridError(f"model path {model}: no config.json there (expected a Hugging Face model directory)")
        return
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes"):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(model, "config.json"), str):
            raise GridError(f"model {model}: not in the local Hugging Face cache and HF_HUB_OFFLINE=1 (download it first, or pass a local path)")


def results_dir(config: pytest.Config) -> Path:
    return Path(config.getoption("kvbench_results") or config.getini("kvbench_results") or "results")
