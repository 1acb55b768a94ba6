"""A local model's family against the grid's methods, and its config against its weights, before anything loads.

Two mistakes used to surface only inside the first item, once per item: a grid naming a method that cannot
compress the model's family (a traceback or a MethodError in every item, the full-cache reference's included),
and a folder whose config.json does not describe its weights (a 600-line load error). Both are one line at
configure time (exit 4) here:
- the family's description before it loads (kvmethods/core/family_table.py: the layer kinds from the config, the
  rest from the family's row) is asked, for every compressing method of the grid, the same rule the runtime
  asks (core/layout.refusal): the line names the family and every refused method with its reason. A family
  without a row is described once loaded (the probe), so it is not refused here;
- the safetensors headers (JSON, read without torch) must hold the embedding the config describes
  ([vocab_size, hidden_size]) and at least its num_hidden_layers decoder layers.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from kvmethods.core.layout import KEEP, refusal
from kvmethods.core.family_table import layout_of
from pytest_kvbench.cases import GridError

_EMBEDDING = re.compile(r"(^|\.)(embed_tokens|wte|word_embeddings)\.weight$")
_LAYER = re.compile(r"\.(?:layers|h|blocks)\.(\d+)\.")
MAX_HEADER = 100 * 2**20  # a safetensors header longer than this is not one


def check_methods(shown: str, config, capabilities: dict, sliding: str = KEEP) -> None:
    """GridError naming the family and every grid method its layout refuses, each with its reason, in one line
    (with sliding-window layers kept or compressed: --kvbench-sliding), so that a user fixes the grid once rather
    than meeting one refused method per run."""
    layout = layout_of(config)
    if layout is None:
        return
    refused = [(label, reason) for label, method_capabilities in capabilities.items()
               for reason in [refusal(layout, method_capabilities, sliding)] if reason is not None]
    if refused:
        each = "; by ".join(f"{label}: {reason}" for label, reason in refused)
        raise GridError(f"model {shown}: family {layout.family!r} cannot be compressed by {each} "
                        f"(docs/models.md; `full` alone runs any causal LM)")


def _header(path: Path) -> dict:
    with open(path, "rb") as handle:
        raw = handle.read(8)
        if len(raw) < 8:
            return {}
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER:
            return {}
        try:
            return json.loads(handle.read(length))
        except ValueError:
            return {}


def _shapes(folder: Path) -> dict[str, list[int]]:
    """Every tensor name and shape the folder's safetensors files declare (empty without safetensors)."""
    files = sorted(folder.glob("*.safetensors"))
    shapes: dict[str, list[int]] = {}
    for path in files:
        for name, entry in _header(path).items():
            if isinstance(entry, dict) and isinstance(entry.get("shape"), list):
                shapes[name] = entry["shape"]
    return shapes


def check_weights(shown: str, config, folder: Path) -> None:
    """GridError when the folder's safetensors contradict config.json (embedding shape, too few layers)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    shapes = _shapes(folder)
    if not shapes:
        return
    vocab, hidden = getattr(text, "vocab_size", None), getattr(text, "hidden_size", None)
    for name, shape in shapes.items():
        if _EMBEDDING.search(name) and len(shape) == 2 and vocab and hidden and shape != [vocab, hidden]:
            raise GridError(f"model {shown}: config.json contradicts its weights: {name} is {shape}, the config says "
                            f"vocab_size {vocab} and hidden_size {hidden}")
    layers = {int(match.group(1)) for name in shapes for match in [_LAYER.search(name)] if match}
    wanted = getattr(text, "num_hidden_layers", None)
    if layers and isinstance(wanted, int) and len(layers) < wanted:
        raise GridError(f"model {shown}: config.json contradicts its weights: the config has {wanted} layers "
                        f"(num_hidden_layers), the weights hold {len(layers)}")
