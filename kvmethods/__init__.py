"""KV-cache compression methods for pytest-kvbench: one small module per method, a registry that
third-party packages extend, budgets, and the compressed generation the harness runs.

See DEVELOPERS.md ("Contract: kvmethods") for the interface and README.md here for adding a method.
Importing the package imports no torch (the pytest plugin validates grids with it in every run): the
names that need torch are resolved on first use.
"""

from importlib import import_module

from .core.budget import FULL_CACHE, Budget
from .core.capabilities import Capability
from .core.errors import MethodError
from .core.params import param
from .registry import (
    ENTRY_POINT_GROUP,
    available_methods,
    describe_method,
    get_method,
    register_method,
    unregister_method,
)

_NEED_TORCH = {"Method": "core.base", "top_positions": "core.base", "LayerInputs": "core.layer_inputs"}


def __getattr__(name: str):
    # lazy for startup time: base and layer_inputs import torch
    if name in _NEED_TORCH:
        return getattr(import_module(f".{_NEED_TORCH[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ENTRY_POINT_GROUP",
    "Budget",
    "Capability",
    "FULL_CACHE",
    "LayerInputs",
    "Method",
    "MethodError",
    "available_methods",
    "describe_method",
    "get_method",
    "param",
    "register_method",
    "top_positions",
    "unregister_method",
]
