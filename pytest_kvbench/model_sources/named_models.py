"""Models known by a short name: ``--kvbench-model smollm2-135m`` and ``kvbench models``.

The names are data (``named_models.toml``), not code, so adding a model is adding a table. A name
resolves to the hub's float weights when they can be had (cached, or the hub reachable), else to a
GGUF file shipped inside an installed Python distribution (found through ``importlib.metadata``,
never by importing it), else to a one-line error that says how to install one.
"""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from pytest_kvbench.model_sources import hub

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

HUB, GGUF = "hub", "gguf"


class NamedModelError(ValueError):
    """An unknown name, or a known one with no source here; one line with the fix."""


@dataclass(frozen=True)
class NamedModel:
    name: str
    description: str
    hub: str
    gguf_distribution: str
    gguf_file: str
    install: str

    def installed_gguf(self) -> Path | None:
        """The GGUF file of the installed distribution, if it is there."""
        try:
            distribution = importlib.metadata.distribution(self.gguf_distribution)
        except importlib.metadata.PackageNotFoundError:
            return None
        listed = any(str(f) == self.gguf_file for f in distribution.files or ())
        path = Path(distribution.locate_file(self.gguf_file))
        return path if listed and path.is_file() else None


@dataclass(frozen=True)
class Resolved:
    kind: str  # HUB or GGUF
    reference: str  # the hub id, or the GGUF file's path


@functools.lru_cache(maxsize=1)
def named_models() -> dict[str, NamedModel]:
    data = tomllib.loads((Path(__file__).parent / "named_models.toml").read_text(encoding="utf-8"))
    return {name: NamedModel(name=name, **fields) for name, fields in data.items()}


def unknown_name_message(name: str) -> str:
    return (f"unknown model {name!r}: not a named model ({', '.join(named_models())}; see `kvbench models`), "
            f"not an existing path and not an org/name hub id")


def resolve(name: str) -> Resolved:
    """The hub repo if cached or reachable, else the installed GGUF file; NamedModelError otherwise."""
    model = named_models().get(name)
    if model is None:
        raise NamedModelError(unknown_name_message(name))
    if hub.model_cached(model.hub) or hub.hub_reachable():
        return Resolved(HUB, model.hub)
    gguf = model.installed_gguf()
    if gguf is not None:
        return Resolved(GGUF, str(gguf))
    raise NamedModelError(f"model {name}: {model.hub} is not in the local Hugging Face cache and the hub cannot be "
                          f"reached, and no GGUF copy is installed; install one with `{model.install}`")


def listing() -> list[dict]:
    """Every named model, its sources and which are available here (``kvbench models``)."""
    rows = []
    for model in named_models().values():
        gguf = model.installed_gguf()
        try:
            resolved: Resolved | None = resolve(model.name)
        except NamedModelError:
            resolved = None
        rows.append({"name": model.name, "description": model.description, "hub": model.hub,
                     "hub_cached": hub.model_cached(model.hub), "gguf": f"{model.gguf_distribution}:{model.gguf_file}",
                     "gguf_installed": str(gguf) if gguf else None,
                     "resolves_to": resolved.kind if resolved else None,
                     "reference": resolved.reference if resolved else None, "install": model.install})
    return rows
