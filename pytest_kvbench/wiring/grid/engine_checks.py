"""The grid's serving-engine specs (``llamacpp:q8_0``) checked at configure, before any model loads.

An engine row needs the engine's Python wheel (the ``[llamacpp]`` extra), a GGUF file for every model of the grid
(llama.cpp loads GGUF files only: a ``.gguf`` path, or a named model with an installed GGUF copy) and the default
protocol (one prompt per sample: the engine compresses nothing, so the other protocols would measure nothing new).
The cache types themselves are checked by the spec grammar (kvmethods/core/engine_caches.py) with the other methods.
Each refusal is one line: a usage error, exit 4.
"""

from __future__ import annotations

import importlib.util

from pytest_kvbench.cases import DEFAULT_PROTOCOL, Grid, GridError
from pytest_kvbench.model_sources.reference import gguf_file_of
from pytest_kvbench.user_paths import shown

ENGINE_MODULE = "xllamacpp"  # llama.cpp's server with Python bindings (pip xllamacpp, MIT)
INSTALL_HINT = "pip install 'pytest-kvbench[llamacpp]'"


def check_engine_methods(grid: Grid) -> None:
    """One line, GridError, for an engine spec this run cannot serve; nothing when the grid names none."""
    engine_specs = [str(spec) for spec in grid.methods if spec.is_engine]
    if not engine_specs:
        return
    first = engine_specs[0]
    if importlib.util.find_spec(ENGINE_MODULE) is None:
        raise GridError(f"{first}: llama.cpp's Python bindings ({ENGINE_MODULE}) are not installed; "
                        f"install them with `{INSTALL_HINT}`")
    for model in grid.models:
        if gguf_file_of(model) is None:
            raise GridError(f"{first}: llama.cpp runs GGUF files only, and model {shown(model)} has none "
                            f"(give a .gguf file or a named model with a GGUF copy, like smollm2-135m)")
    others = [protocol for protocol in grid.protocols if protocol != DEFAULT_PROTOCOL]
    if others:
        raise GridError(f"{first}: an engine's cache types run under the protocol {DEFAULT_PROTOCOL!r} only, "
                        f"not {others[0]!r} (the engine compresses nothing the protocol could change)")
