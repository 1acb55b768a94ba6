"""Command-line options, ini keys and the TOML grid file, resolved into one validated Grid.

Precedence: command line > ``--kvbench-config`` TOML file > ``[tool.pytest.ini_options]`` ini
keys > built-in defaults for the embedded model. Every value is validated here, at configure
time, so bad input stops pytest with a usage error before any model or dataset loads.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from kvmethods import FULL_CACHE, Budget, MethodError, describe_method
from kvmethods.core.capabilities import Capability
from pytest_kvbench import tasks as task_registry, user_paths
from pytest_kvbench.input_values import MAX_TOKENS, parse_shard, shown, shown_list, split_list
from pytest_kvbench.wiring.grid import canonical
from pytest_kvbench.wiring.grid import model_refs
from pytest_kvbench.wiring.grid import named_tasks
from pytest_kvbench.wiring.grid import presets
from pytest_kvbench.wiring.grid.cache_protocols import (check_decoding_intervals, check_per_turn, check_tasks_serve_protocols,
                                             parse_protocols)
from pytest_kvbench.cases import (
    DEFAULT_MODEL,
    Grid,
    GridError,
    MethodSpec,
    parse_positive_int,
    parse_seed,
)
from pytest_kvbench.tasks import TaskError, check_context_length, get_task
from pytest_kvbench.tasks.sources import is_fixture_dir

from pytest_kvbench.wiring.grid.option_table import DEFAULT_METHODS, GRID_OPTIONS, add_options  # noqa: F401 (add_options, GRID_OPTIONS: read here by tests)

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

DEFAULT_BUDGETS = ["128", "256"]
DEFAULT_SAMPLES = 20

TOML_KEYS = {"models", "model", "methods", "budgets", "tasks", "samples", "seed", "seeds",
             "context_lengths", "protocol", "dtype", "attn_implementation", "data", "max_prompt_tokens",
             "preset"}
LIST_KEYS = {"models", "model", "methods", "budgets", "tasks", "seeds", "context_lengths"}  # may be arrays


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


def _cli(config: pytest.Config, name: str) -> Any:
    return config.getoption("kvbench_" + name.replace("-", "_"))


def _ini(config: pytest.Config, name: str) -> Any:
    key = "kvbench_" + name.replace("-", "_")
    try:
        value = config.getini(key)
    except (TypeError, ValueError) as exc:  # pytest 9's native TOML ini values are typed
        raise GridError(f"ini key {key}: {exc}") from None
    return value  # None when unset; [] or "" when set but empty (refused by _Sources)


def load_grid_file(path: str) -> dict:
    """Read a TOML grid file; its keys may sit at top level or under [kvbench]."""
    try:
        file = user_paths.existing_file(path, "grid file")
    except user_paths.PathError as exc:
        raise GridError(str(exc)) from None
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise GridError(f"grid file {path}: malformed TOML ({exc})") from None
    except OSError as exc:
        raise GridError(f"grid file {path}: cannot be read ({exc.strerror or exc})") from None
    if "kvbench" in data:
        beside = sorted(set(data) - {"kvbench"})
        if beside:  # a table or key next to [kvbench] would be ignored: refused like an unknown key inside it
            raise GridError(f"grid file {path}: unknown table(s) or key(s) beside [kvbench]: {', '.join(beside)}; "
                            f"put the grid keys under [kvbench] or at the top level, not both")
        data = data["kvbench"]
    if not isinstance(data, dict):
        raise GridError(f"grid file {path}: 'kvbench' must be a table ([kvbench]), got {_toml_type(data)}")
    unknown = sorted(set(data) - TOML_KEYS)
    if unknown:
        tables = [key for key in unknown if isinstance(data[key], dict)]
        what = "unknown table(s)" if len(tables) == len(unknown) else "unknown key(s)"
        raise GridError(f"grid file {path}: {what} {', '.join(unknown)}; valid keys: {', '.join(sorted(TOML_KEYS))}")
    for key, value in data.items():
        _check_toml_value(path, key, value)
    return data


def _toml_type(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "an array"
    return f"{type(value).__name__} {shown(value)}"


def _is_toml_scalar(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _is_method_value(value: Any) -> bool:
    """A method table's value: a string or number, or a nested method table (a wrapper's inner press)."""
    if isinstance(value, dict):
        return all(_is_method_value(v) for v in value.values())
    return _is_toml_scalar(value) or isinstance(value, (bool, float))


def _check_toml_value(path: str, key: str, value: Any) -> None:
    """Strings and integers, or arrays of them where a key takes several (method tables too)."""
    entries = value if isinstance(value, list) and key in LIST_KEYS else [value]
    for entry in entries:
        if key == "methods" and isinstance(entry, dict):
            bad = {k: v for k, v in entry.items() if not _is_method_value(v)}
            if bad:
                raise GridError(f"grid file {path}: method table {entry} has a value that is not a string or number")
            continue
        if not _is_toml_scalar(entry):
            what = "a string or integer" + (", or an array of them" if key in LIST_KEYS else "")
            raise GridError(f"grid file {path}: {key} must be {what}, got {_toml_type(entry)}")


def _toml_methods(value: Any, where: str) -> list[Any]:
    """TOML methods: strings, or tables like {name = "snapkv", window = 64} (kvmethods.spec reads them)."""
    out: list[Any] = []
    for entry in value if isinstance(value, list) else [value]:
        if isinstance(entry, dict):
            try:
                out.append(MethodSpec.from_table(entry))
            except MethodError as exc:
                raise GridError(f"grid file: {exc}") from None
        else:
            out.extend(split_list(entry, where))
    return out


def _method_spec(value: MethodSpec | str) -> MethodSpec:
    try:
        return value if isinstance(value, MethodSpec) else MethodSpec.parse(str(value))
    except MethodError as exc:
        raise GridError(str(exc)) from None


class _Sources:
    """Where each grid value comes from: command line, then the TOML file, then ini keys.

    A value that is given but empty (``--kvbench-budgets ""``, ``budgets = []``, a blank ini
    key) is refused: falling back to the default would run a grid nobody asked for.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.path = config.getoption("kvbench_config")
        self.file = load_grid_file(self.path) if self.path is not None else {}
        self.preset: presets.Preset | None = None
        self.preset_where = ""
        name, where = self.scalar("preset")
        if name is not None:
            self.preset = presets.load_preset(name)
            self.preset_where = f"{where} {self.preset.name}"

    def raw(self, name: str) -> tuple[Any, str]:
        """(value, where it came from); (None, "") when unset."""
        cli = _cli(self.config, name)
        if cli is not None:
            return cli, f"--kvbench-{name}"
        key = name.replace("-", "_")
        for file_key in (key, "models") if key == "model" else (key,):
            if file_key in self.file:
                return self.file[file_key], f"grid file {self.path}: {file_key}"
        value = _ini(self.config, name)
        if value is not None:
            return value, f"ini key kvbench_{key}"
        if self.preset is not None and key in self.preset.settings:
            models = [str(m) for m in self.listed("model") or [DEFAULT_MODEL]]
            value = self.preset.default(key, models)
            if value is not None:
                return value, self.preset_where
        return None, ""

    def given_against_preset(self) -> dict[str, str]:
        """The preset's settings that the user set elsewhere: grid key -> where (checked by presets.check_grid)."""
        given = {}
        for key in self.preset.settings if self.preset else ():
            _, where = self.raw(key.replace("_", "-"))
            if where and where != self.preset_where:
                given[key] = where
        return given

    def listed(self, name: str, parse=None) -> list | None:
        value, where = self.raw(name)
        if value is None:
            return None
        if name == "methods" and where.startswith("grid file"):
            values = _toml_methods(value, where)
        else:
            values = split_list(value, where)
        if not values:
            raise GridError(f"{where} is empty; give at least one value or leave it out for the default")
        return [parse(v, where) if parse else v for v in values]

    def scalar(self, name: str) -> tuple[Any, str]:
        """(value, where it came from); a given but blank value is refused."""
        value, where = self.raw(name)
        if value is not None and not str(value).strip():
            raise GridError(f"{where} is empty; give a value or leave it out for the default")
        return value, where


def resolve_grid(config: pytest.Config) -> Grid:
    """Merge the three sources and validate; GridError (one line) on anything unusable."""
    sources = _Sources(config)
    grid = Grid()
    grid.models = [str(m).strip() for m in sources.listed("model") or [DEFAULT_MODEL]]
    methods = sources.listed("methods") or DEFAULT_METHODS
    grid.methods = [_method_spec(m) for m in methods]
    budgets = [str(b).strip() for b in sources.listed("budgets") or DEFAULT_BUDGETS]  # parsed into the grid by _validate
    grid.tasks = [str(t).strip() for t in sources.listed("tasks") or []]
    samples, where = sources.scalar("samples")
    if samples == presets.ALL_SAMPLES and where == sources.preset_where:
        grid.samples = None  # every record of each dataset
    else:
        grid.samples = parse_positive_int(samples, where) if samples is not None else DEFAULT_SAMPLES
    grid.seeds = canonical.unique(_seeds(sources))
    grid.context_lengths = canonical.unique(sources.listed("context-lengths", _token_count) or [])
    protocols = sources.listed("protocol")
    if protocols is not None:
        grid.protocols = parse_protocols(protocols)
    dtype, where = sources.scalar("dtype")
    grid.dtype = str(dtype or "auto")
    if grid.dtype not in DTYPES:
        raise GridError(f"{where}: unknown dtype {shown(grid.dtype)}; valid: {', '.join(DTYPES)}")
    attn, _ = sources.scalar("attn-implementation")
    grid.attn_implementation = str(attn or "sdpa").strip()
    data, _ = sources.scalar("data")
    grid.data_dir = str(data) if data is not None else None
    max_prompt, where = sources.scalar("max-prompt-tokens")
    grid.max_prompt_tokens = _token_count(max_prompt, where) if max_prompt is not None else None
    if sources.preset is not None:
        grid.preset = sources.preset.name
        presets.check_grid(grid, sources.preset, sources.preset_where, sources.given_against_preset(), budgets)
    _validate(grid, budgets, selection=(config.option.keyword, config.option.markexpr))
    return grid


DTYPES = ("auto", "float32", "bfloat16", "float16")
# which source wins: a command-line option over the grid file, the grid file over an ini key or a preset
_PRECEDENCE = ("--kvbench-", "grid file", "ini key")


def _precedence(where: str) -> int:
    return next((rank for rank, prefix in enumerate(_PRECEDENCE) if where.startswith(prefix)), len(_PRECEDENCE))


def _token_count(text: Any, where: str) -> int:
    return parse_positive_int(text, where, maximum=MAX_TOKENS)


def _seeds(sources: _Sources) -> list[int]:
    """--kvbench-seeds, or the one --kvbench-seed, or 0. Both set at one level (both options, both grid
    file keys, both ini keys) contradict each other and are refused with both values; set at different
    levels, the more specific source wins as for every other value."""
    seeds_value, seeds_where = sources.raw("seeds")
    seed_value, seed_where = sources.scalar("seed")
    if seeds_value is not None and seed_value is not None and _precedence(seeds_where) == _precedence(seed_where):
        raise GridError(f"{seed_where} {shown_list(seed_value)} contradicts {seeds_where} {shown_list(seeds_value)}; "
                        f"give one of them")
    if seeds_value is not None and (seed_value is None or _precedence(seeds_where) < _precedence(seed_where)):
        return sources.listed("seeds", parse_seed)
    return [parse_seed(seed_value, seed_where)] if seed_value is not None else [0]


def _validate(grid: Grid, budgets: list[str], selection: tuple[str | None, str | None] = (None, None)) -> None:
    """Names, budgets and paths checked against the registries, still without loading a model;
    repeated values are reduced to one canonical spelling (canonical.py). ``selection``: pytest's -k and -m
    expressions, whose task names join a default grid (named_tasks.py)."""
    methods, compressing, capabilities = [], [], {}
    for spec in grid.methods:  # describe_method names the valid methods for an unknown one
        try:
            described = describe_method(spec.name, **spec.param_dict)
        except MethodError as exc:
            raise GridError(str(exc)) from None
        if Capability.COMPRESSES in described.capabilities:
            compressing.append(described.name)
        if described.capabilities & (Capability.COMPRESSES | Capability.OWN_STORAGE):
            capabilities[str(spec)] = described.capabilities
        for name, value in described.params.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise GridError(f"{spec.name}: parameter {name!r} must be a finite number, got {value!r}")
        methods.append(canonical.method(spec, described.name, described.params))
    grid.methods = [spec for spec, _ in canonical.unique(methods, key=lambda pair: pair[1])]
    try:
        grid.budgets = canonical.unique((Budget.parse(b) for b in budgets), key=lambda budget: budget.spec)
    except MethodError as exc:
        raise GridError(f"--kvbench-budgets: {exc}") from None
    if FULL_CACHE in grid.budgets:
        raise GridError(f"--kvbench-budgets: {FULL_CACHE.spec!r} is not a compression budget; the full cache runs "
                        f"once per task as the method {FULL_CACHE.spec!r}")
    too_large = [budget.spec for budget in grid.budgets if budget.kind == "tokens" and budget.value > MAX_TOKENS]
    if too_large:
        raise GridError(f"--kvbench-budgets: {shown(too_large[0])} tokens is more than any context ({MAX_TOKENS:,} at most)")
    tasks_named = grid.tasks_named = bool(grid.tasks)
    grid.tasks = grid.tasks or list(task_registry.DEFAULT_TASKS)
    if not tasks_named:  # -k qasper / -m infinitebench select from every task the registry knows
        on_fixtures = is_fixture_dir(grid.data_dir) or (grid.data_dir is None and set(grid.models) == {DEFAULT_MODEL})
        grid.tasks_added, grid.tasks_unavailable = named_tasks.added_tasks(*selection, grid.tasks, on_fixtures)
        grid.tasks = grid.tasks + grid.tasks_added
    try:
        grid.tasks = canonical.unique(task_registry.get_task(task).name for task in grid.tasks)
    except task_registry.TaskError as exc:
        raise GridError(str(exc)) from None
    grid.smoke_tasks = [t for t in grid.tasks if t in task_registry.SMOKE_TASKS]
    check_tasks_serve_protocols(grid, tasks_named)
    check_decoding_intervals(grid)
    check_per_turn(grid)
    if not grid.context_lengths:
        grid.context_lengths = [task_registry.DEFAULT_CONTEXT_LENGTH]
    grid.models = canonical.models(grid.models)
    limits = {model: model_refs.check_model_reference(model, compressing, capabilities) for model in grid.models}
    _check_context_lengths(grid, limits)
    model_refs.check_attention_implementation(grid.attn_implementation)
    if grid.data_dir is None and grid.models == [DEFAULT_MODEL]:
        grid.data_dir = "fixtures"  # the embedded model runs on the shipped fixture data, never the hub
    if grid.data_dir and grid.data_dir != "fixtures":
        try:
            user_paths.existing_dir(grid.data_dir, "--kvbench-data")
        except user_paths.PathError as exc:
            raise GridError(str(exc)) from None


def _check_context_lengths(grid: Grid, limits: dict[str, int | None]) -> None:
    """Each RULER context length leaves room for the task's answer and fits every model, where the
    model's maximum is known from its config (a model's own check at load time covers the rest)."""
    for name in grid.tasks:
        task = get_task(name)
        if task.suite != "ruler":
            continue
        for length in grid.context_lengths:
            for limit in limits.values():
                try:
                    check_context_length(task, limit, length)
                except TaskError as exc:
                    raise GridError(f"--kvbench-context-lengths: {exc}") from None


def results_dir(config: pytest.Config) -> Path:
    """The results directory, checked writable at configure (a file there would lose every record)."""
    given = config.getoption("kvbench_results")
    where = "--kvbench-results" if given is not None else "ini key kvbench_results"
    if given is None:
        given = config.getini("kvbench_results")
        if not str(given).strip():  # a blank key is not "unset": the default would be used silently
            raise GridError(f"{where} is empty; give a directory or leave the key out for results/")
    try:
        return user_paths.writable_dir(given, where)
    except user_paths.PathError as exc:
        raise GridError(str(exc)) from None
