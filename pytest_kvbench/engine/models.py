"""Load each (model, dtype, attention implementation) once per worker process.

Loading an 8B model takes a minute and most of a GPU, so items never load models themselves:
they ask this cache, which loads on first use (never at collection) and records the load time
and on-disk size once. The embedded default model is loaded through exactly the same
``from_pretrained`` path as a hub model; only its location differs. A GGUF file (or a named model
resolved to one) is loaded from its float conversion (gguf_conversion.py), made on first use. A named base model
(named_models.toml: ``template = "base"``) loses any chat template its tokenizer carries, so every task prompts it
with the plain text, as RULER's ``base`` template does. A family whose
causal-LM class cannot run sdpa (gemma2, gpt-oss) loads with eager, as transformers would pick, and the record
says which implementation ran.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from kvmethods.adapters.transformers_compat import attention_implementation, supported_attention

from pytest_kvbench.engine.gguf_conversion import converted_model
from pytest_kvbench.engine.hardware.costs import model_size_on_disk
from pytest_kvbench.engine.model_revision import hub_revision
from pytest_kvbench.model_sources.embedded import DEFAULT_MODEL_DIR
from pytest_kvbench.model_sources.named_models import BASE
from pytest_kvbench.model_sources.reference import model_source


class ModelLoadError(RuntimeError):
    """A model that could not be loaded; the item fails with this message."""


@dataclass
class LoadedModel:
    name: str
    source: str
    model: Any
    tokenizer: Any
    device: str
    dtype: str
    attn_implementation: str
    family: str
    load_s: float
    size_bytes: int
    max_positions: int | None
    eos_token_ids: set[int] = field(default_factory=set)
    gguf: dict | None = None  # the GGUF file's GgufInfo.as_record() + where its conversion is cached

    def info(self) -> dict:
        gguf = {"gguf": self.gguf} if self.gguf else {}  # absent for other models, as in older records
        return gguf | {
            "name": self.name,
            "source": self.source,
            "revision": hub_revision(self.source),  # the hub commit loaded, None for a local directory
            "dtype": self.dtype,
            "attn_implementation": self.attn_implementation,
            "family": self.family,
            "device": self.device,
            "load_s": round(self.load_s, 4),
            "size_bytes": self.size_bytes,
            "max_positions": self.max_positions,
        }


def pick_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _torch_dtype(dtype: str, device: str):
    if dtype == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return getattr(torch, dtype)


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


class ModelCache:
    """Per-process cache; ``loads`` counts real loads (tests assert one per worker)."""

    def __init__(self) -> None:
        self._models: dict[tuple[str, str, str], LoadedModel] = {}
        self.loads = 0

    def get(self, name: str, dtype: str = "auto", attn_implementation: str = "sdpa") -> tuple[LoadedModel, bool]:
        """The loaded model and whether this call loaded it."""
        key = (name, dtype, attn_implementation)
        if key in self._models:
            return self._models[key], False
        loaded = self._load(name, dtype, attn_implementation)
        self._models[key] = loaded
        self.loads += 1
        return loaded, True

    def _load(self, name: str, dtype: str, attn_implementation: str) -> LoadedModel:
        device = pick_device()
        torch_dtype = _torch_dtype(dtype, device)
        if dtype == "bfloat16" and device == "cuda" and not torch.cuda.is_bf16_supported(including_emulation=False):
            # a CPU without bfloat16 is refused at configure (wiring/grid/dtype_support.py); a GPU only torch knows
            raise ModelLoadError(f"could not load model {name!r}: --kvbench-dtype bfloat16: this GPU "
                                 f"({torch.cuda.get_device_name()}) has no bfloat16 arithmetic; use float16 or float32")
        start = time.perf_counter()
        gguf = None
        try:
            resolved = model_source(name)
            source = resolved.location
            if resolved.gguf is not None:
                gguf = _converted_gguf(resolved.gguf)
                source = gguf["converted"]
            tokenizer = AutoTokenizer.from_pretrained(source)
            if resolved.template == BASE:
                tokenizer.chat_template = None  # a base model: RULER's "base" template, the task text as it is
            config = AutoConfig.from_pretrained(source)
            model = AutoModelForCausalLM.from_pretrained(
                source, config=config, dtype=torch_dtype,
                attn_implementation=supported_attention(config, attn_implementation)
            )
        except Exception as exc:  # a corrupt config.json raises KeyError, TypeError, ... besides OSError
            text = " ".join(str(exc).split()) or type(exc).__name__  # one line, however long the original
            text = text if len(text) <= 300 else text[:297] + "..."
            raise ModelLoadError(f"could not load model {name!r}: {text}") from exc
        model.to(device).eval()
        torch.set_grad_enabled(False)
        load_s = time.perf_counter() - start
        config = model.config
        return LoadedModel(
            name=name,
            source=resolved.location,
            model=model,
            tokenizer=tokenizer,
            device=device,
            dtype=str(torch_dtype).replace("torch.", ""),
            attn_implementation=attention_implementation(model),  # what runs: eager where the family has no sdpa
            family=getattr(config, "model_type", "unknown"),
            load_s=load_s,
            size_bytes=gguf["size_bytes"] if gguf else model_size_on_disk(source),
            max_positions=getattr(config, "max_position_embeddings", None),
            eos_token_ids=_eos_ids(model, tokenizer),
            gguf=gguf,
        )


def _converted_gguf(path: Path) -> dict:
    """The GGUF file's record fields, its float conversion's folder and whether this load made it."""
    folder, info, built = converted_model(path)
    return info.as_record() | {"converted": str(folder), "converted_now": built}
