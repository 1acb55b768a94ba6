"""One model reference -> where its weights come from: a folder or hub id, or a GGUF file.

The configure-time checks and the loader both ask here, so ``smollm2-135m`` means the same
source to both (the hub when it can be had, else the installed GGUF file). An existing path wins
over a name: ``./smollm2-135m`` on disk is that folder.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pytest_kvbench.model_sources import named_models
from pytest_kvbench.model_sources.embedded import DEFAULT_MODEL, DEFAULT_MODEL_DIR
from pytest_kvbench.model_sources.gguf_file import looks_like_gguf


@dataclass(frozen=True)
class ModelSource:
    name: str  # as the grid spells it
    location: str  # what from_pretrained reads (a folder or a hub id), or the GGUF file's path
    gguf: Path | None = None  # set for a GGUF file: converted once, then loaded from the cache
    template: str = named_models.CHAT  # "base": prompts without a chat template (a named base model)


def _exists(reference: str) -> bool:
    try:
        return os.path.exists(os.path.expanduser(reference))
    except (OSError, ValueError):
        return False


def is_named(reference: str) -> bool:
    return reference in named_models.MODELS and not _exists(reference)


def model_source(reference: str) -> ModelSource:
    """``default`` is the embedded model; a named model is resolved (NamedModelError when it has no source)."""
    if reference == DEFAULT_MODEL:
        return ModelSource(reference, str(DEFAULT_MODEL_DIR))
    if is_named(reference):
        resolved = named_models.resolve(reference)
        template = named_models.MODELS.get(reference).template
        if resolved.kind == named_models.GGUF:
            return ModelSource(reference, resolved.reference, Path(resolved.reference), template)
        return ModelSource(reference, resolved.reference, template=template)
    if looks_like_gguf(reference):
        return ModelSource(reference, reference, Path(reference).expanduser())
    return ModelSource(reference, reference)


def gguf_file_of(reference: str) -> Path | None:
    """The GGUF file a serving engine (llama.cpp) loads for this reference: a ``.gguf`` path, or a named model's
    installed GGUF file even when transformers takes the hub's weights; None when the model has no GGUF file."""
    if reference == DEFAULT_MODEL:
        return None
    if is_named(reference):
        return named_models.MODELS.get(reference).installed_gguf()
    if looks_like_gguf(reference):
        return Path(reference).expanduser()
    return None
