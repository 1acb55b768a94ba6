"""Models known by a short name: ``--kvbench-model smollm2-135m`` and ``kvbench models``.

The names are data (``named_models.toml``), not code, so adding a model is adding a table. A name
resolves to the hub's float weights when they can be had (cached, or the hub reachable; a model without a
``hub`` entry, such as a gated one, never does), else to a GGUF file shipped inside an installed Python
distribution (found through ``importlib.metadata``, never by importing it; a file shipped in part distributions
is assembled once into the GGUF cache, gguf_parts.py), else to a one-line error that says how to install one.
``template`` says how prompts meet the model: ``chat`` (its tokenizer's chat template, when it has one) or
``base`` (RULER's template for base models: the task text as it is, no chat template even if the file has one).
"""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from kvmethods.core.lazy_registry import LazyRegistry
from pytest_kvbench.model_sources import gguf_parts, hub
from pytest_kvbench.model_sources.gguf_file import GgufError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

HUB, GGUF = "hub", "gguf"
CHAT, BASE = "chat", "base"  # RULER's scripts/data/template.py calls the plain one "base"


class NamedModelError(ValueError):
    """An unknown name, or a known one with no source here; one line with the fix."""


@dataclass(frozen=True)
class NamedModel:
    name: str
    description: str
    gguf_distribution: str
    gguf_file: str  # a path in gguf_distribution, or (with gguf_parts) the assembled file's name
    install: str
    hub: str = ""  # empty: the name never means the hub's weights
    gguf_parts: tuple[str, ...] = ()  # "distribution:path" of each part, in order
    sha256: str = ""  # of the GGUF file; checked when it is assembled from parts
    template: str = CHAT

    def _distribution_installed(self) -> bool:
        try:
            importlib.metadata.distribution(self.gguf_distribution)
        except importlib.metadata.PackageNotFoundError:
            return False
        return True

    def gguf_available(self) -> bool:
        """The GGUF file, or all of its parts, installed here (nothing is assembled)."""
        if self.gguf_parts:
            return self._distribution_installed() and gguf_parts.part_paths(self.gguf_parts) is not None
        return self.installed_gguf() is not None

    def installed_gguf(self) -> Path | None:
        """The GGUF file of the installed distribution, if it is there; a file in parts is assembled (once) into
        the GGUF cache and its sha256 checked (NamedModelError when it cannot be)."""
        if self.gguf_parts:
            paths = gguf_parts.part_paths(self.gguf_parts) if self._distribution_installed() else None
            if paths is None:
                return None
            try:
                return gguf_parts.assemble(paths, self.sha256, self.gguf_file, self.install)
            except GgufError as exc:
                raise NamedModelError(f"model {self.name}: {exc}") from None
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
    return {name: NamedModel(name=name, **{key: tuple(value) if isinstance(value, list) else value
                                           for key, value in fields.items()})
            for name, fields in data.items()}


def _named_model(obj: object, origin: str) -> NamedModel:
    if not isinstance(obj, NamedModel):
        raise NamedModelError(f"{origin}: {obj!r} is not a pytest_kvbench.model_sources.named_models.NamedModel")
    return obj


# names -> models: named_models.toml's tables, and the `kvbench.models` entry-point group's NamedModel objects
MODELS: LazyRegistry[NamedModel] = LazyRegistry(
    "model", "kvbench.models", lambda: named_models(), error=NamedModelError, check=_named_model, sort=False,
    plural="named models", note="nor an existing path or an org/name hub id (see `kvbench models`)")


def unknown_name_message(name: str) -> str:
    return str(MODELS.unknown(name))


def resolve(name: str) -> Resolved:
    """The hub repo if cached or reachable, else the installed GGUF file; NamedModelError otherwise."""
    model = MODELS.get(name)
    if model.hub and (hub.model_cached(model.hub) or hub.hub_reachable()):
        return Resolved(HUB, model.hub)
    gguf = model.installed_gguf()
    if gguf is not None:
        return Resolved(GGUF, str(gguf))
    if not model.hub:
        raise NamedModelError(f"model {name}: its GGUF file is not installed (the {model.gguf_distribution} "
                              f"distribution{' and its parts' if model.gguf_parts else ''}); install it with "
                              f"`{model.install}`")
    raise NamedModelError(f"model {name}: {model.hub} is not in the local Hugging Face cache and the hub cannot be "
                          f"reached, and no GGUF copy is installed; install one with `{model.install}`")


def _gguf_here(model: NamedModel) -> str | None:
    """Where the model's GGUF file is (or, in parts, will be assembled) when it is installed; nothing assembled."""
    if not model.gguf_available():
        return None
    if model.gguf_parts:
        return str(gguf_parts.assembled_path(model.sha256, model.gguf_file))
    return str(model.installed_gguf())


def listing() -> list[dict]:
    """Every named model, its sources and which are available here (``kvbench models``; a GGUF file in parts is
    listed, not assembled)."""
    rows = []
    for model in map(MODELS.get, MODELS.names()):
        gguf = _gguf_here(model)
        hub_used = bool(model.hub) and (hub.model_cached(model.hub) or hub.hub_reachable())
        kind, reference = (HUB, model.hub) if hub_used else (GGUF, gguf) if gguf else (None, None)
        where = (f"{model.gguf_distribution} ({len(model.gguf_parts)} parts) -> {model.gguf_file}" if model.gguf_parts
                 else f"{model.gguf_distribution}:{model.gguf_file}")
        rows.append({"name": model.name, "description": model.description, "hub": model.hub or None,
                     "hub_cached": bool(model.hub) and hub.model_cached(model.hub), "gguf": where,
                     "gguf_installed": gguf, "resolves_to": kind, "reference": reference, "install": model.install,
                     "template": model.template})
    return rows
