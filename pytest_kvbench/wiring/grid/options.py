"""Command-line options, ini keys and the TOML grid file, resolved into one validated Grid.

Precedence: command line > ``--kvbench-config`` TOML file > ``[tool.pytest.ini_options]`` ini
keys > built-in defaults for the embedded model. Every value is validated at configure time, so bad
input stops pytest with a usage error before any model or dataset loads: the options themselves in
command_line.py, the grid file in grid_file.py, the resolved grid in grid_checks.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kvmethods import MethodError
from kvmethods.core.layout import SLIDING_POLICIES
from pytest_kvbench import user_paths
from pytest_kvbench.cases import (DEFAULT_MODEL, MEASURE_ALONE, Grid, GridError, MethodSpec, parse_positive_int,
                                  parse_seed)
from pytest_kvbench.record_key import DEFAULT_SLIDING
from pytest_kvbench.input_values import MAX_TOKENS, shown, shown_list, split_list
from pytest_kvbench.wiring.grid import canonical, presets
from pytest_kvbench.wiring.grid.cache_protocols import parse_protocols
from pytest_kvbench.wiring.grid.command_line import DEFAULT_METHODS
from pytest_kvbench.wiring.grid.grid_checks import validate_grid
from pytest_kvbench.wiring.grid.grid_file import load_grid_file, toml_methods

DEFAULT_BUDGETS = ["128", "256"]
# A method that evicts nothing (kivi, hf_quantized, think) keeps every token whatever the token budget: under the
# default budgets it runs at this byte budget instead (an eighth of the full cache's bytes: 2-bit KIVI's nominal
# size), whose KV/budget column says how its bytes compare. Budgets given anywhere apply to every method.
DEFAULT_STORAGE_BUDGETS = ["m0.125"]
DEFAULT_SAMPLES = 20


def _cli(config: pytest.Config, name: str) -> Any:
    return config.getoption("kvbench_" + name.replace("-", "_"))


def _ini(config: pytest.Config, name: str) -> Any:
    key = "kvbench_" + name.replace("-", "_")
    try:
        value = config.getini(key)
    except (TypeError, ValueError) as exc:  # pytest 9's native TOML ini values are typed
        raise GridError(f"ini key {key}: {exc}") from None
    return value  # None when unset; [] or "" when set but empty (refused by _Sources)


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
            values = toml_methods(value, where)
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
    given_budgets = sources.listed("budgets")
    budgets = [str(b).strip() for b in given_budgets or DEFAULT_BUDGETS]  # parsed into the grid by validate_grid
    storage_budgets = [] if given_budgets else DEFAULT_STORAGE_BUDGETS
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
    sliding, where = sources.scalar("sliding")
    grid.sliding = str(sliding).strip() if sliding is not None else DEFAULT_SLIDING
    if grid.sliding not in SLIDING_POLICIES:
        raise GridError(f"{where}: unknown value {shown(grid.sliding)}; valid: {', '.join(SLIDING_POLICIES)}")
    measure_alone, where = sources.scalar("measure-alone")
    grid.measure_alone = str(measure_alone).strip() if measure_alone is not None else MEASURE_ALONE[0]
    if grid.measure_alone not in MEASURE_ALONE:
        raise GridError(f"{where}: unknown value {shown(grid.measure_alone)}; valid: {', '.join(MEASURE_ALONE)}")
    max_prompt, where = sources.scalar("max-prompt-tokens")
    grid.max_prompt_tokens = _token_count(max_prompt, where) if max_prompt is not None else None
    if sources.preset is not None:
        grid.preset = sources.preset.name
        presets.check_grid(grid, sources.preset, sources.preset_where, sources.given_against_preset(), budgets)
    validate_grid(grid, budgets, selection=(config.option.keyword, config.option.markexpr),
                  storage_budgets=storage_budgets)
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
