"""A GGUF file turned into float weights once, through transformers, and saved to the cache.

transformers reads GGUF with ``from_pretrained(folder, gguf_file=name)`` and dequantizes every
weight; asked explicitly (``GgufConfig(dequantize=True)``, where this transformers has it) so the
model holds plain float tensors that ``save_pretrained`` writes as safetensors, with the tokenizer
(and its chat template) read from the same file. Later loads read the saved folder.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from pytest_kvbench.model_sources import gguf_cache
from pytest_kvbench.model_sources.gguf_file import GgufInfo
from pytest_kvbench.model_sources.gguf_index import gguf_info


def _dequantizing_config() -> dict:
    try:
        # lazy: asked per call, since transformers before GgufConfig has none to import
        from transformers import GgufConfig
    except ImportError:  # older transformers always dequantize GGUF weights
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _save_float_model(gguf_path: Path, info: GgufInfo, folder: Path) -> dict:
    where, name = str(gguf_path.parent), gguf_path.name
    model = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32, **_dequantizing_config())
    tokenizer = AutoTokenizer.from_pretrained(where, gguf_file=name)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return {"source_file": info.file, "architecture": info.architecture, "quantization": info.quantization,
            "transformers": transformers.__version__}


def converted_model(gguf_path: Path) -> tuple[Path, GgufInfo, bool]:
    """The cache folder holding the file's float model, its header, and whether this call converted it."""
    info = gguf_info(gguf_path)
    folder, built = gguf_cache.converted(info.sha256, lambda into: _save_float_model(gguf_path, info, into))
    return folder, info, built
