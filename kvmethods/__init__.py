"""KV-cache compression methods for pytest-kvbench: one small module per method, a registry that
third-party packages extend, budgets, and the compressed generation the harness runs.

See DEVELOPERS.md ("Contract: kvmethods") for the interface and README.md here for adding a method.
"""

from .base import Method, param, top_positions
from .budget import Budget
from .errors import MethodError
from .layer_inputs import LayerInputs
from .registry import (
    ENTRY_POINT_GROUP,
    available_methods,
    get_method,
    register_method,
    unregister_method,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "Budget",
    "LayerInputs",
    "Method",
    "MethodError",
    "available_methods",
    "get_method",
    "param",
    "register_method",
    "top_positions",
    "unregister_method",
]
