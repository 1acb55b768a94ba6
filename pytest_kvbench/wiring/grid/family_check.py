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

import re
from pathlib import Path

from kvmethods.core.capabilities import Capability
from kvmethods.core.layout import COMPRESS, KEEP, SLIDING, refusal
from kvmethods.core.family_table import layout_of
from pytest_kvbench.cases import GridError
from pytest_kvbench.model_sources.gguf_file import NOT_BENCHMARKABLE
from pytest_kvbench.model_sources.safetensors_header import tensor_shapes

_EMBEDDING = re.compile(r"(^|\.)(embed_tokens|wte|word_embeddings)\.weight$")
_LAYER = re.compile(r"\.(?:layers|h|blocks)\.(\d+)\.")


def check_runnable(shown: str, config) -> None:
    """GridError for a config of a model the benchmark cannot run at all (a state-space or encoder-decoder model:
    the same table as a GGUF file's architecture), whatever the grid's methods."""
    model_type = str(getattr(config, "model_type", "") or "")
    reason = NOT_BENCHMARKABLE.get(model_type)
    if reason is not None:
        raise GridError(f"model {shown}: model_type {model_type!r} cannot be benchmarked: it is {reason}; use a "
                        f"decoder-only transformer (llama, mistral, qwen2, qwen3, ...)")


def _compressing(capabilities: dict) -> list[str]:
    return [label for label, caps in capabilities.items() if Capability.COMPRESSES in caps]


def check_sliding_option(shown: str, has_sliding: bool | None, capabilities: dict, sliding: str) -> None:
    """``--kvbench-sliding compress`` on a model without sliding-window layers would change nothing but the names
    of its compressing items (``|sliding=compress``: a gate would call them new): refused instead.
    ``has_sliding`` None: not known before the model loads (a family without a row), accepted."""
    labels = _compressing(capabilities)
    if sliding != COMPRESS or not labels or has_sliding is not False:
        return
    raise GridError(f"model {shown}: --kvbench-sliding compress, but the model has no sliding-window layers: it would "
                    f"rename {labels[0]}'s items (|sliding=compress) for no effect; leave the option out")


def check_methods(shown: str, config, capabilities: dict, sliding: str = KEEP) -> None:
    """GridError naming the family and every grid method its layout refuses, each with its reason, in one line
    (with sliding-window layers kept or compressed: --kvbench-sliding), so that a user fixes the grid once rather
    than meeting one refused method per run."""
    layout = layout_of(config)
    check_sliding_option(shown, None if layout is None else any(layer.kind == SLIDING for layer in layout.layers),
                         capabilities, sliding)
    if layout is None:
        return
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if capabilities and any(layer.latent for layer in layout.layers) and kv_heads is not None and kv_heads != heads:
        raise GridError(f"model {shown}: family {layout.family!r} with num_key_value_heads {kv_heads} and "
                        f"num_attention_heads {heads} cannot be compressed by {next(iter(capabilities))}: "
                        f"multi-head latent attention makes keys and values per query head, which the compressed "
                        f"cache keeps, and transformers then repeats them by the ratio the config states; set "
                        f"num_key_value_heads to num_attention_heads (as DeepSeek's own configs), or run `full` alone")
    refused = [(label, reason) for label, method_capabilities in capabilities.items()
               for reason in [refusal(layout, method_capabilities, sliding)] if reason is not None]
    if refused:
        each = "; by ".join(f"{label}: {reason}" for label, reason in refused)
        raise GridError(f"model {shown}: family {layout.family!r} cannot be compressed by {each} "
                        f"(docs/models.md; `full` alone runs any causal LM)")


def _shapes(folder: Path) -> dict[str, list[int]]:
    """Every tensor name and shape the folder's safetensors files declare (empty without safetensors)."""
    files = sorted(folder.glob("*.safetensors"))
    shapes: dict[str, list[int]] = {}
    for path in files:
        shapes.update(tensor_shapes(path))
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
