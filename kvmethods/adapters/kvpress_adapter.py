"""kvpress:<PressName>: any NVIDIA kvpress press as a grid method (optional extra `pytest-kvbench[kvpress]`).

`kvpress:SnapKVPress:window_size=64` builds `kvpress.SnapKVPress(window_size=64)`; parameters are coerced
by the type of the press's default (or annotation). Wrapper presses take their inner press by name, its own
parameters prefixed with the wrapper's parameter name: `kvpress:AdaKVPress:press=SnapKVPress:
press.window_size=64:alpha_safeguard=0.1` (TOML: `press = {name = "SnapKVPress", window_size = 64}`),
nesting as deep as needed (`press.press=...`). A list of presses (ComposedPress) is not supported.

The press runs as kvpress intends (`with press(model):` around our prefill forward); everything else,
decoding at original positions, fidelity, timing and memory, is measured as for native methods.
Budgets: a ratio budget `r0.5` is `compression_ratio=0.5`; a token budget B on a prompt of T tokens is
`compression_ratio=(T - B - 0.5) / T`, so kvpress' `int(T * (1 - ratio))` keeps exactly B (the 0.5 absorbs
float error). Head-wise presses (AdaKVPress, KVzipPress, CriticalAdaKVPress, ...) only mask evicted keys
through kvpress' attention patch and keep the full tensors: their records show the attended tokens per
head as kept tokens and logical bytes, the full tensors as physical bytes, and `kv_masked_only: true`.
"""

from __future__ import annotations

import inspect
import typing
from contextlib import contextmanager
from importlib.metadata import version
from typing import Any

from ..core.base import Method
from ..core.capabilities import Capability
from ..core.errors import MethodError
from ..core.params import coerce
from .decoder_parts import decoder_layers

EXTRA_HINT = "pip install 'pytest-kvbench[kvpress]'"
_SCALARS = {"int": int, "float": float, "bool": bool, "str": str}


def _kvpress(spec: str):
    try:
        # lazy: kvpress is an optional extra (pip install pytest-kvbench[kvpress])
        import kvpress
    except ImportError:
        raise MethodError(f"{spec} needs the kvpress package, which is not installed: {EXTRA_HINT}") from None
    return kvpress


def press_names(kvpress) -> list[str]:
    return sorted(n for n in dir(kvpress) if n.endswith("Press") and isinstance(getattr(kvpress, n), type)
                  and n not in ("BasePress", "ScorerPress"))


def _scalar_type(parameter: inspect.Parameter) -> type | None:
    if parameter.default not in (inspect.Parameter.empty, None) and type(parameter.default) in _SCALARS.values():
        return type(parameter.default)
    annotation = parameter.annotation
    options = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]  # Optional[int]
    names = [a if isinstance(a, str) else getattr(a, "__name__", "") for a in options]
    return _SCALARS.get(names[0]) if len(names) == 1 else None


def build_press(kvpress, spec: str, press_name: str, params: dict[str, Any]):
    """An instance of kvpress.<press_name>; nested presses from `param=<PressName>` + `param.key=value`."""
    if press_name not in press_names(kvpress):
        raise MethodError(f"{spec}: kvpress {version('kvpress')} has no press {press_name!r}; "
                          f"valid presses: {', '.join(press_names(kvpress))}")
    cls = getattr(kvpress, press_name)
    signature = inspect.signature(cls)
    own = {k: v for k, v in params.items() if "." not in k}
    nested = {k: v for k, v in params.items() if "." in k}
    valid = ", ".join(signature.parameters)
    arguments: dict[str, Any] = {}
    for key, value in own.items():
        if key not in signature.parameters or key == "compression_ratio":
            why = "is set from the budget" if key == "compression_ratio" else f"is unknown; valid parameters: {valid}"
            raise MethodError(f"{spec}: parameter {key!r} of {press_name} {why}")
        if (isinstance(value, str) and value in press_names(kvpress)) or "Press" in str(
                signature.parameters[key].annotation):
            inner = {k.split(".", 1)[1]: v for k, v in nested.items() if k.split(".", 1)[0] == key}
            arguments[key] = build_press(kvpress, spec, str(value), inner)
            continue
        kind = _scalar_type(signature.parameters[key])
        if kind is None:
            raise MethodError(f"{spec}: parameter {key!r} of {press_name} is not a number, flag, string or press")
        arguments[key] = coerce(spec, key, kind, value)
    orphans = sorted(k for k in nested if k.split(".", 1)[0] not in arguments)
    if orphans:
        raise MethodError(f"{spec}: parameter {orphans[0]!r} names no inner press of {press_name}")
    for key in ("press", "base_press"):  # wrappers need their inner press
        if key in signature.parameters and key not in arguments and signature.parameters[key].default in (
                None, inspect.Parameter.empty):
            raise MethodError(f"{spec}: {press_name} wraps another press: add {key}=<PressName> "
                              f"(e.g. {key}=SnapKVPress)")
    try:
        press = cls(**arguments)
    except Exception as error:  # kvpress validates with asserts and TypeErrors
        raise MethodError(f"{spec}: {press_name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())}) "
                          f"is refused by kvpress: {type(error).__name__}: {error}".replace("\n", " ")) from None
    # static: a press deciding its own ratio (SimLayerKVPress) raises from its getter before any forward
    if inspect.getattr_static(press, "compression_ratio", None) is None:
        raise MethodError(f"{spec}: {press_name} has no compression_ratio, so budgets cannot be mapped onto it")
    try:
        press.compression_ratio = 0.0  # the budget sets it before each prefill (prefill_context)
    except AttributeError:
        raise MethodError(f"{spec}: {press_name} decides its compression itself (its compression_ratio cannot be "
                          f"set), so budgets cannot be mapped onto it") from None
    return press


class KVPressMethod(Method):
    """A kvpress press, applied around the prefill forward (Method.prefill_context)."""

    name = "kvpress"
    capabilities = Capability.COMPRESSES | Capability.RUNS_PREFILL

    def __init__(self, press_name: str, **params: Any):
        self.spec = f"kvpress:{press_name}"
        self.name = self.spec
        self.press_name = press_name
        self.user_params = {k: params[k] for k in sorted(params)}
        self.press = build_press(_kvpress(self.spec), self.spec, press_name, params)
        self.config = repr(self.press)

    def params(self) -> dict:
        return {**self.user_params, "press_config": self.config}

    @contextmanager
    def prefill_context(self, model, budget_tokens: int, prompt_len: int, ratio: float | None):
        self.press.compression_ratio = ratio if ratio is not None else (prompt_len - budget_tokens - 0.5) / prompt_len
        for module in _attention_modules(model):
            module.masked_key_indices = None
        with self.press(model):
            yield

    def masked_tokens_per_head(self, model, cache) -> list[list[int]] | None:
        """Per layer and KV head, cached tokens that kvpress' attention patch hides (head-wise presses)."""
        out, any_masked = [], False
        for module, layer in zip(_attention_modules(model), cache.layers):
            counts = [0] * layer.keys.shape[1]
            masked = getattr(module, "masked_key_indices", None)
            if masked is not None:
                any_masked = True
                for head in masked[1].tolist():
                    counts[head] += 1
            out.append(counts)
        return out if any_masked else None


def _attention_modules(model):
    return [layer.self_attn for layer in decoder_layers(model)]


def kvpress_method(spec: str, params: dict[str, Any]) -> Method:
    """`kvpress:<PressName>` with its parameters -> a Method; MethodError (one line) on anything unusable."""
    _, _, press_name = spec.partition(":")
    if not press_name:
        raise MethodError(f"{spec}: name the press, e.g. kvpress:SnapKVPress")
    return KVPressMethod(press_name, **params)
