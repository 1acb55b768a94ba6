"""--kvbench-preset NAME: a published evaluation's settings, shipped as data (pytest_kvbench/presets/NAME.toml).

A preset fixes what makes a row comparable with a published table (tasks, context length, budgets,
protocol, sample count, truncation) and leaves the rest open (model, methods, seeds, dtype, data
directory). It is the lowest-ranked source of grid values: what it sets fills every value the user
left unset, and a value the user did set must agree with it, by the setting's rule:

- ``exact``: the same values (the protocol's task list, its context length);
- ``subset``: some of the preset's values, or of its ``allowed`` ones (each budget is its own row of
  the published table; kvpress's query-aware runs are the second protocol it allows);
- ``at_most``: a positive number no larger than the preset's (a partial run, which the export names);
- ``by_model_name``: a value chosen by a substring of the model name (KVCache-Factory's truncation).

Anything else is refused in one line naming the option and the preset. docs/official-evaluations.md describes
each preset and the sources of its values.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from kvmethods import Budget
from kvmethods.core.lazy_registry import LazyRegistry
from pytest_kvbench.cases import Grid, GridError
from pytest_kvbench.input_values import shown_list
from pytest_kvbench.tasks import get_task

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ALL_SAMPLES = "all"  # samples = "all": every record of each dataset
RULES = ("exact", "subset", "at_most", "by_model_name")
SETTINGS = ("tasks", "context_lengths", "budgets", "protocol", "samples", "max_prompt_tokens")


@dataclass(frozen=True)
class Setting:
    name: str  # a grid file key: tasks, context_lengths, budgets, protocol, samples, max_prompt_tokens
    rule: str  # one of RULES
    values: Any  # a list (exact, subset), a number or "all" (at_most), {model substring: value}
    allowed: tuple = ()  # subset: what a user may choose from, when more than the default values


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    source: str  # repository@commit and files the values come from
    export: str  # the `kvbench export --format` that writes the protocol's own layout
    settings: dict[str, Setting]

    def default(self, key: str, models: list[str]) -> Any:
        """The value the preset gives an unset grid key (None: the preset leaves it open)."""
        setting = self.settings.get(key)
        if setting is None:
            return None
        if setting.rule == "by_model_name":
            return _by_model_name(setting, models)
        return setting.values


def _preset_files():
    return resources.files("pytest_kvbench").joinpath("presets")


def _shipped() -> dict[str, Any]:
    """The shipped presets: NAME.toml files, read when named."""
    return {entry.name.removesuffix(".toml"): entry for entry in sorted(_preset_files().iterdir(), key=str)
            if entry.name.endswith(".toml")}


def _preset_source(obj: Any, origin: str) -> Any:
    """An entry point's preset: a Preset, or a TOML file in the shipped layout (a path or a resources file)."""
    if isinstance(obj, Preset) or hasattr(obj, "read_text"):
        return obj
    raise GridError(f"{origin}: {obj!r} is neither a Preset nor a TOML file (a pathlib.Path or a resources file)")


# names -> preset files; third parties add theirs through the `kvbench.presets` entry-point group (docs/plugins.md)
PRESETS: LazyRegistry[Any] = LazyRegistry("preset", "kvbench.presets", _shipped, error=GridError,
                                          check=_preset_source)


def available_presets() -> list[str]:
    return PRESETS.names()


@functools.cache
def load_preset(name: str) -> Preset:
    """The preset ``name`` (shipped, or an entry point's); GridError (one line listing the presets) for any other
    name."""
    name = str(name).strip()
    source = PRESETS.get(name)
    if isinstance(source, Preset):
        return source
    data = tomllib.loads(source.read_text(encoding="utf-8"))
    settings = {}
    for key, table in data.get("settings", {}).items():
        if key not in SETTINGS or table.get("rule") not in RULES:  # a packaging mistake, caught by the tests
            raise GridError(f"preset {name}: setting {key!r} with rule {table.get('rule')!r} is not supported")
        settings[key] = Setting(key, table["rule"], table["values"], tuple(table.get("allowed", ())))
    return Preset(name, data["description"], data["source"], data["export"], settings)


def _by_model_name(setting: Setting, models: list[str]) -> Any:
    """The value of the last substring found in the lowercased model name (KVCache-Factory's loop over
    model2maxlen); several models needing different values are refused, since the grid holds one."""
    found = {}
    for model in models:
        matches = [value for key, value in setting.values.items() if key in str(model).lower()]
        if matches:
            found[model] = matches[-1]
    if len(set(found.values())) > 1:
        shown = ", ".join(f"{model}: {value}" for model, value in found.items())
        raise GridError(f"{setting.name} depends on the model under this preset ({shown}); run one model family "
                        f"at a time")
    return next(iter(found.values()), None)


def _canonical(key: str, values: list) -> list:
    """One spelling per value (``r0.50`` is ``r0.5``); a value that does not parse stays as given, so it
    disagrees with the preset here and, had it agreed, validation would name what is wrong with it."""
    spell = {"tasks": lambda v: get_task(str(v)).name, "budgets": lambda v: Budget.parse(str(v)).spec}.get(key, str)
    out = []
    for value in values:
        try:
            out.append(spell(value))
        except ValueError:
            out.append(str(value))
    return out


def check_grid(grid: Grid, preset: Preset, preset_where: str, given: dict[str, str],
               budgets: Sequence[str] = ()) -> None:
    """GridError when a value the user set (``given``: grid key -> where it came from; ``budgets``: the budgets
    as given, not parsed yet) contradicts the preset; values the preset filled in agree by construction. Run before the grid's own validation, so a
    contradiction is named as one (not as, say, a task that cannot serve a protocol)."""
    chosen = {"tasks": grid.tasks, "budgets": list(budgets), "context_lengths": grid.context_lengths,
              "protocol": grid.protocols, "samples": grid.samples, "max_prompt_tokens": grid.max_prompt_tokens}
    for key, where in given.items():
        setting = preset.settings.get(key)
        if setting is None:
            continue
        value = chosen[key]
        if setting.rule == "exact":
            wanted = _canonical(key, setting.values)
            agrees = sorted(_canonical(key, value)) == sorted(wanted)
            fixed = f"fixes {key} = {shown_list(wanted)}"
        elif setting.rule == "subset":
            wanted = _canonical(key, setting.allowed or setting.values)
            agrees = set(_canonical(key, value)) <= set(wanted)
            fixed = f"allows {key} from {shown_list(wanted)}"
        elif setting.rule == "at_most":
            agrees = setting.values == ALL_SAMPLES or value <= setting.values
            fixed = f"runs at most {setting.values} {key}"
        else:
            wanted = _by_model_name(setting, grid.models)
            agrees = wanted is None or value == wanted
            fixed = f"sets {key} = {wanted} for {shown_list(grid.models)}"
        if not agrees:
            raise GridError(f"{where} {shown_list(value)} contradicts {preset_where}, which {fixed}")
