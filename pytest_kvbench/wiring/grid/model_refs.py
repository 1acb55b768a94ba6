"""Whether a model reference and its loading settings can work, found out before any weights load.

A sweep that names a model it cannot load should stop at once, not after the first item has
spent minutes on the data: so a local path must be a directory with a ``config.json`` that
transformers can read (a corrupt one is one line here, instead of a 600-line traceback in every
item), a hub id must be one the hub accepts and, with ``HF_HUB_OFFLINE=1``, be in the local
cache, and the attention implementation must be one transformers knows. Only ``config.json`` is
ever read; nothing is downloaded. A ``.gguf`` file must be whole, of an architecture transformers
maps and the benchmark can run (not ``mamba``: no KV cache), of a family the grid's compressing methods
hook (kvmethods' SUPPORTED_FAMILIES; once converted, its config.json's layers as a folder's), with the ``gguf``
and ``accelerate`` packages installed, and its conversion cache (``KVBENCH_GGUF_CACHE``) a writable directory with
room for the float weights; a named model (model_sources/) must have a source here. Neither check imports torch;
transformers only to read a config.json.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

from kvmethods.adapters.transformers_compat import attention_implementations
from kvmethods.core.family_names import SUPPORTED_FAMILIES
from pytest_kvbench import user_paths
from pytest_kvbench.cases import DEFAULT_MODEL, GridError
from pytest_kvbench.model_sources import gguf_cache, gguf_file, named_models
from pytest_kvbench.wiring.grid import family_check
from pytest_kvbench.model_sources.embedded import DEFAULT_MODEL_DIR
from pytest_kvbench.model_sources.gguf_index import gguf_info
from pytest_kvbench.model_sources.hub import cached_file, hub_offline
from pytest_kvbench.model_sources.reference import is_named, model_source
from pytest_kvbench.input_values import shown

EAGER = "eager"
MAX_CONFIG_BYTES = 16 * 2**20  # the largest config.json on the hub is well under 1 MiB


def is_local_reference(model: str) -> bool:
    """Paths start with . / ~, exist, or have more than one slash; anything else is a hub id."""
    try:
        exists = os.path.exists(model)
    except (OSError, ValueError):
        exists = False
    return model.startswith((".", "/", "~")) or exists or model.count("/") > 1


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _max_positions(config: object) -> int | None:
    value = getattr(config, "max_position_embeddings", None)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _check_config(model: str, location: str, capabilities: dict | None = None, sliding: str = "keep") -> int | None:
    """transformers can read the model's config.json (no weights, no download), and the folder holds
    weights and a tokenizer (model_sources/folder_contents.py); the grid's methods can compress its family
    (family_check.py); the model's maximum length."""
    # lazy for startup time: transformers, only when configure reads a local model's config.json
    from transformers import AutoConfig

    from pytest_kvbench.model_sources.folder_contents import missing_parts

    try:
        config = AutoConfig.from_pretrained(location, local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError, JSONDecodeError ...
        raise GridError(f"model {user_paths.shown(model)}: config.json cannot be read ({_first_line(exc)})") from None
    family_check.check_runnable(user_paths.shown(model), config)
    missing = missing_parts(Path(location))
    if missing:
        raise GridError(f"model {user_paths.shown(model)}: {user_paths.shown(location)} has a config.json but "
                        f"{' and '.join(missing)}; from_pretrained could not load it")
    family_check.check_methods(user_paths.shown(model), config, capabilities or {}, sliding)
    family_check.check_weights(user_paths.shown(model), config, Path(location))
    return _max_positions(config)


def _default_model_max_positions() -> int | None:
    """The embedded model's maximum length, from its config.json (without importing transformers)."""
    data = json.loads((DEFAULT_MODEL_DIR / "config.json").read_text(encoding="utf-8"))
    return _max_positions(SimpleNamespace(**data))


def cached_config(model: str) -> str | None:
    return cached_file(model, "config.json")


def check_model_reference(model: str, compressing: list[str] | None = None,
                          capabilities: dict | None = None, sliding: str = "keep") -> int | None:
    """A local path holds a readable model config; a hub id is valid (and cached when offline); a GGUF file
    can be converted and compressed by ``compressing`` (the grid's methods that evict tokens).

    Returns the model's maximum number of positions when its config is at hand (None: unknown).
    """
    if model == DEFAULT_MODEL:
        family_check.check_sliding_option("default", False, capabilities or {}, sliding)  # all global layers
        return _default_model_max_positions()
    if not model.strip():
        raise GridError("model name is empty")
    if is_named(model):
        return _check_named(model, compressing or [], capabilities, sliding)
    if gguf_file.looks_like_gguf(model):
        return _check_gguf(model, None, compressing or [], capabilities, sliding)
    if is_local_reference(model):
        try:
            path = user_paths.existing_dir(model, "model path")
            user_paths.regular_file(path / "config.json", "model path", max_bytes=MAX_CONFIG_BYTES)
        except user_paths.PathError as exc:
            raise GridError(f"{exc} (expected a Hugging Face model directory with a config.json, "
                            f"or a .gguf file)") from None
        return _check_config(model, str(path), capabilities, sliding)
    # lazy for startup time: huggingface_hub, only when a hub id is given
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(model)
    except HFValidationError as exc:
        reason = _first_line(exc).replace(model, user_paths.shown(model))  # huggingface_hub quotes it in full
        raise GridError(f"model {user_paths.shown(model)}: not a local directory and not a valid hub id "
                        f"({reason})") from None
    if "/" not in model and cached_config(model) is None:  # a bare word: a mistyped name, not an old hub id
        raise GridError(named_models.unknown_name_message(model))
    if hub_offline():
        cached = cached_config(model)
        if cached is None:
            raise GridError(f"model {model}: not in the local Hugging Face cache and HF_HUB_OFFLINE=1 "
                            f"(download it first, or pass a local path)")
        return _check_config(model, str(Path(cached).parent), capabilities, sliding)
    return None


def _check_named(model: str, compressing: list[str], capabilities: dict | None = None,
                 sliding: str = "keep") -> int | None:
    """The name has a source here (hub or GGUF file), and that source is checked like any other."""
    try:
        source = model_source(model)
    except named_models.NamedModelError as exc:
        raise GridError(str(exc)) from None
    if source.gguf is not None:
        return _check_gguf(model, source.location, compressing, capabilities, sliding)
    return check_model_reference(source.location, compressing, capabilities, sliding)


def _check_gguf(model: str, location: str | None, compressing: list[str], capabilities: dict | None = None,
                sliding: str = "keep") -> int | None:
    """The packages are there, the conversion cache can take the float weights, the file is whole and
    transformers maps its architecture, which the compressing methods hook (and, once converted, whose layers they
    can compress); its length."""
    missing = gguf_file.missing_packages()
    if missing:
        raise GridError(f"model {user_paths.shown(model)}: loading a GGUF file needs the {' and '.join(missing)} "
                        f"package{'s' if len(missing) > 1 else ''}; install them with `{gguf_file.INSTALL_HINT}`")
    try:
        path = user_paths.regular_file(location or model, "model file", min_bytes=gguf_file.MIN_GGUF_BYTES)
        gguf_cache.check_root()
        info = gguf_info(path)
        gguf_file.check_family(info, path, compressing, SUPPORTED_FAMILIES)
        gguf_cache.check_room(info)
    except (user_paths.PathError, gguf_file.GgufError) as exc:
        raise GridError(str(exc)) from None
    _check_converted_layers(model, info.sha256, capabilities, sliding)
    return info.context_length


def _check_converted_layers(model: str, sha256: str, capabilities: dict | None, sliding: str) -> None:
    """A GGUF file converted already has a config.json in its cache entry: its layers (sliding windows ...)
    against the grid's methods, as a folder's are (family_check.py). Before its first conversion only the
    architecture's name is checked (check_family): the header does not say which layers slide."""
    entry = gguf_cache.entry_dir(sha256)
    manifest = gguf_cache.read_manifest(entry)
    if not capabilities or manifest is None or manifest.get("source_sha256") != sha256:
        return
    # lazy for startup time: transformers, only for a GGUF model converted already
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(entry), local_files_only=True)
    except Exception:  # noqa: BLE001 - a damaged entry is rebuilt at load; nothing to check it against here
        return
    family_check.check_methods(user_paths.shown(model), config, capabilities, sliding)


def known_attention_implementations() -> list[str]:
    return [EAGER, *attention_implementations()]


# implementation -> (transformers.utils function saying whether it can run here, what it needs)
_NEEDS = {
    "flash_attention_2": ("is_flash_attn_2_available", "the flash-attn package and a CUDA GPU"),
    "flash_attention_3": ("is_flash_attn_3_available", "the flash-attn 3 package (flash_attn_interface) and a GPU"),
    "flash_attention_4": ("is_flash_attn_4_available", "the flash-attn 4 package and a GPU"),
    "flex_attention": ("is_torch_flex_attn_available", "a torch with flex attention"),
}
_HUB_KERNEL_NEEDS = ("is_kernels_available", "the kernels package (pip install kernels)")


def check_attention_implementation(name: str) -> None:
    """One transformers knows, or a hub kernel (``org/repo``), which transformers resolves itself; and
    installed here: flash attention without its package (or without a GPU) used to fail every item."""
    hub_kernel = "/" in name.strip("/") and not name.startswith("/")
    if name in ("sdpa", EAGER):
        return  # the defaults need no transformers import at configure time
    if not hub_kernel:
        known = known_attention_implementations()
        if name not in known:
            raise GridError(f"unknown attention implementation {shown(name)}; valid: {', '.join(known)} "
                            f"(or a hub kernel such as kernels-community/flash-attn)")
    available, needs = _HUB_KERNEL_NEEDS if hub_kernel else _NEEDS.get(name.rpartition("|")[2], (None, None))
    if available is None:
        return
    import transformers.utils  # lazy: transformers is heavy, read only when such an implementation is asked for

    if not getattr(transformers.utils, available, lambda: True)():
        raise GridError(f"--kvbench-attn-implementation {name}: not available here (transformers.utils.{available}() "
                        f"is False); it needs {needs}")
