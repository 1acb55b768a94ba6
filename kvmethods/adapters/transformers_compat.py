"""The one place that knows which transformers versions pytest-kvbench supports and how they are called.

transformers renames things between minor versions: 5.24 passes the cache to model forwards, attention
functions and attention-module hooks as `cache` (and warns that `past_key_values` goes away in 5.40), while
5.2 (kvpress 0.5.5's pin, the oldest version we support) only knows `past_key_values`. Every use of
transformers' calling conventions in kvmethods/ and pytest_kvbench/ goes through this module, so the next
rename is fixed here once, and the range CI tests (SUPPORTED, mirrored by pyproject's requirement) is checked
before anything runs.

Importing this module does not import transformers: the supported-range check must answer with one line
when the installed transformers is too new to even import our code. The transformers names below
(DynamicCache, AttentionInterface, ...) are imported on first access (PEP 562 module `__getattr__`).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

OLDEST_SUPPORTED = "5.2"  # kvpress 0.5.5 pins transformers 5.2.0 (constraints-kvpress.txt, CI's second env)
NEWEST_TESTED = "5.24"  # constraints.txt, CI's main env
SUPPORTED_TEXT = f">={OLDEST_SUPPORTED},<5.25"
SUPPORTED = SpecifierSet(SUPPORTED_TEXT)  # pyproject.toml's transformers requirement
ALLOW_UNTESTED_ENV = "KVBENCH_ALLOW_UNTESTED_TRANSFORMERS"  # on: an untested version only warns (drift CI job); read
# by pytest_kvbench/wiring/grid/transformers_range.py as a switch (1/true/yes, 0/false/no, empty)

# Public names re-exported from transformers, imported on first access.
_LAZY_NAMES = {
    "DynamicCache": "transformers.cache_utils",
    "DynamicLayer": "transformers.cache_utils",
    "DynamicSlidingWindowLayer": "transformers.cache_utils",
    "AttentionInterface": "transformers",
    "AttentionMaskInterface": "transformers.masking_utils",
    "sdpa_mask": "transformers.masking_utils",
    "sdpa_attention_forward": "transformers.integrations.sdpa_attention",
}

# hf_quantized backends: transformers' quantized cache layer class and its availability check.
QUANTIZED_LAYERS = {"quanto": ("QuantoQuantizedLayer", "is_optimum_quanto_available"),
                    "hqq": ("HQQQuantizedLayer", "is_hqq_available")}


def __getattr__(name: str) -> Any:
    if name not in _LAZY_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    globals()[name] = value
    return value


# -- the supported range (importlib.metadata only) ---------------------------------------------------

def installed_version() -> str | None:
    """The installed transformers distribution's version, None when it is not installed."""
    try:
        return importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return None


def range_problem(version: str | None) -> str | None:
    """One line saying why `version` of transformers is not supported, or None when it is."""
    supported = f"pytest-kvbench supports transformers {SUPPORTED_TEXT} (tested {OLDEST_SUPPORTED} and {NEWEST_TESTED})"
    if version is None:
        return f"transformers is not installed; {supported}"
    try:
        # Pre-releases of a supported version are accepted: the drift job may install one.
        if SUPPORTED.contains(Version(version), prereleases=True):
            return None
    except InvalidVersion:
        pass
    return f"transformers {version} is installed; {supported}"


# -- calling conventions -----------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _cache_keyword(forward_owner: type) -> str:
    parameters = inspect.signature(forward_owner.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def cache_argument(module, cache) -> dict[str, Any]:
    """The keyword argument that hands `cache` to `module`'s forward (a model or its decoder): `cache` where
    the forward names it (5.24 on), `past_key_values` before; decided once per class from its signature."""
    return {_cache_keyword(type(module)): cache}


def cache_from_kwargs(kwargs: dict):
    """The cache an attention function or attention-module hook received, under either name (None if none)."""
    return kwargs.get("cache", kwargs.get("past_key_values"))


def mask_query_length(query) -> int:
    """The number of new tokens from what a cache layer's get_mask_sizes() receives: the query length itself
    (an int, 5.24) or the new tokens' cache_position tensor (5.2)."""
    return query if isinstance(query, int) else int(query.shape[0])


def quantized_layer_class(backend: str) -> type:
    """transformers' quantized cache layer class of an hf_quantized backend ("quanto" or "hqq")."""
    # lazy for startup time: transformers' cache module, only for hf_quantized
    import transformers.cache_utils

    return getattr(transformers.cache_utils, QUANTIZED_LAYERS[backend][0])


def quantized_backend_available(backend: str) -> bool:
    """Whether transformers finds the backend's package (optimum-quanto, hqq) installed."""
    # lazy for startup time: transformers, only for hf_quantized
    import transformers.utils

    return bool(getattr(transformers.utils, QUANTIZED_LAYERS[backend][1])())


def attention_implementations() -> list[str]:
    """The attention implementations registered with transformers' AttentionInterface."""
    return list(__getattr__("AttentionInterface")().valid_keys())


def supported_attention(config, wanted: str) -> str:
    """The attention implementation to load a model of `config` with: `wanted`, unless it is sdpa and the family's
    causal-LM class says it cannot run sdpa (gemma2, gpt-oss in 5.24: eager, as transformers picks by itself)."""
    if wanted != "sdpa":
        return wanted
    # lazy for startup time: transformers' auto mapping, only when a model is loaded
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    try:
        model_class = MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    except KeyError:  # not a causal LM transformers maps: from_pretrained says why
        return wanted
    return wanted if getattr(model_class, "_supports_sdpa", True) else "eager"


def attention_implementation(model) -> str:
    """The attention implementation the model runs now (transformers keeps it in a private config field)."""
    return model.config._attn_implementation


def register_attention(name: str, attention, mask) -> None:
    """Registers an attention function and its mask function under `name` (the model names it while active)."""
    __getattr__("AttentionInterface").register(name, attention)
    __getattr__("AttentionMaskInterface").register(name, mask)
