"""The built-in methods described as data: name, implementation, declared parameters, capabilities, and their
names in kvpress and KVCache-Factory.

The plugin validates a grid at configure time and collects one item per case, and it is loaded in every
pytest run of its users: none of that may import torch. So the registry answers "which methods exist,
what parameters do they take, is this spec valid" from this table, and imports a method's module only
to build it (when an item runs, or when validating needs the method's own code: `checked_in_code`, a
cross-parameter check or a base method to build). The rows are generated from the classes, where each method
is declared once (catalog_rows.py, written by `python -m kvmethods.core.catalog_gen`);
tests/kvmethods/test_method_catalog.py fails when the file is stale or a row and its class disagree.

The spec vocabulary that the registry reads before any implementation (composition `+`, the
`per_turn` and `prefill_chunk` parameters any evicting method takes, the `kvpress:` prefix) and the
protocols that the grid checks are named here once; composition.py, per_turn.py, chunked.py and
generation.py take their names from it.
"""

from __future__ import annotations

from dataclasses import dataclass

from .capabilities import Capability
from .catalog_rows import ROWS
from .params import ParamSpec

SEPARATOR = "+"  # snapkv+kivi: a composition (composition.py)
PER_TURN = "per_turn"  # snapkv:per_turn=true: re-compression after each turn (per_turn.py)
PREFILL_CHUNK = "prefill_chunk"  # snapkv:prefill_chunk=512: chunked prefill (chunked.py)
KVPRESS_PREFIX = "kvpress:"  # kvpress:SnapKVPress: a kvpress press (kvpress_adapter.py)
BASE = "base"  # adakv:base=snapkv: a wrapper's parameter naming the method it wraps (score_wrapper.py)
# How a prompt is compressed (generation.py); the group protocols serve several questions from one context.
PROTOCOLS = ("question_in_window", "query_agnostic", "shared_context", "multi_turn")
GROUP_PROTOCOLS = ("shared_context", "multi_turn")

@dataclass(frozen=True)
class MethodEntry:
    """One built-in method, described without importing it."""

    name: str
    target: str  # "module:Class", imported only to build the method
    params: tuple[ParamSpec, ...] = ()
    capabilities: Capability = Capability.COMPRESSES
    checked_in_code: bool = False  # validation needs the class: a check() or from_params() of its own
    environment_check: bool = False  # its check() reads the environment (Method.environment_check)
    # the same algorithm elsewhere (Method's attributes of the same names): exports and comparisons read them
    kvpress_press: str = ""  # kvpress press, `kvpress:` spec tail; a wrapper's wraps its base's (kvpress_spec)
    kvpress_defaults: str = ""  # our parameters equal to that press's defaults ("window=64:kernel=5")
    kvpress_name: str = ""  # kvpress evaluation's PRESS_REGISTRY name
    kvcache_factory_name: str = ""  # KVCache-Factory's --method name
    paper: str = ""  # where the method comes from (Method.paper): `kvbench methods` lists it

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def class_name(self) -> str:
        return self.target.partition(":")[2]

    def default(self, param: str):
        """A declared parameter's default (a wrapper's `base`: the method it wraps unless told)."""
        return {spec.name: spec.default for spec in self.params}.get(param)


BUILTINS: dict[str, MethodEntry] = {row["name"]: MethodEntry(**row) for row in ROWS}


def kvpress_spec(name: str) -> str | None:
    """The adapter spec of the kvpress press doing what built-in `name` does, each at its own defaults
    (`kvpress:SnapKVPress`); a wrapper's press wraps the press of its default base
    (`kvpress:CriticalKVPress:press=SnapKVPress`). None when kvpress has no such press."""
    entry = BUILTINS.get(name)
    if entry is None or not entry.kvpress_press:
        return None
    if Capability.WRAPS not in entry.capabilities:
        return KVPRESS_PREFIX + entry.kvpress_press
    base = BUILTINS.get(str(entry.default(BASE)))
    return f"{KVPRESS_PREFIX}{entry.kvpress_press}:press={base.kvpress_press}" if base and base.kvpress_press else None
