"""The ``--kvbench-config`` TOML grid file, read and checked key by key (types, unknown keys and tables).

Its keys sit at the top level or under ``[kvbench]``; methods may be tables (``{name = "snapkv", window = 64}``,
read by kvmethods.spec). options.py merges what it returns with the command line and ini keys.
"""

from __future__ import annotations

from typing import Any

from kvmethods import MethodError
from pytest_kvbench import user_paths
from pytest_kvbench.cases import GridError, MethodSpec
from pytest_kvbench.input_values import shown, split_list

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib

TOML_KEYS = {"models", "model", "methods", "budgets", "tasks", "samples", "seed", "seeds",
             "context_lengths", "protocol", "dtype", "attn_implementation", "data", "max_prompt_tokens",
             "preset", "sliding", "measure_alone"}
LIST_KEYS = {"models", "model", "methods", "budgets", "tasks", "seeds", "context_lengths"}  # may be arrays


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


def toml_methods(value: Any, where: str) -> list[Any]:
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
