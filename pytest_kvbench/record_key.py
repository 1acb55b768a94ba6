"""A record's key, the identity of one benchmark item: built and parsed here, nowhere else.

``model|method|budget|task[@ctx]|seedN[|protocol=P][|sliding=compress]`` names an item across runs: resume, dedup,
baselines, merge and every table label use it. Case.key (cases.py) builds it with ``ItemKey.of``;
views label a record with ``ItemKey.parse``, never by splitting the item id (method labels may hold
hyphens, ids join their parts with hyphens).
"""

from __future__ import annotations

from typing import NamedTuple

DEFAULT_PROTOCOL = "question_in_window"
_PROTOCOL_PREFIX = "protocol="
DEFAULT_SLIDING = "keep"  # sliding-window layers kept as their window (--kvbench-sliding; kvmethods core/layout)
_SLIDING_PREFIX = "sliding="


def protocol_key_part(protocol: str) -> str:
    """What a protocol adds to a key: nothing for the default (keys of older runs and baselines stay
    valid), else ``|protocol=<name>``."""
    return "" if protocol == DEFAULT_PROTOCOL else f"|{_PROTOCOL_PREFIX}{protocol}"


def sliding_key_part(sliding: str) -> str:
    """What compressing sliding-window layers adds to a key (so such results never pair with kept windows'):
    nothing for the default (older keys stay valid), else ``|sliding=<policy>``."""
    return "" if sliding == DEFAULT_SLIDING else f"|{_SLIDING_PREFIX}{sliding}"


def task_label(task: str, context_length: int | None) -> str:
    """A task as keys and tables name it: ``niah_single_1@4096`` for a context length, else the name."""
    return f"{task}@{context_length}" if context_length is not None else task


class ItemKey(NamedTuple):
    """The parts of a key, as tables and folders label a record."""

    model: str
    method: str  # as the grid spelled it, with the parameters the user set: snapkv(window=64)
    budget: str  # budget spec, or "full"
    task: str  # task name, with @context_length for RULER: niah_single_1@4096
    seed: str  # seedN
    protocol: str = DEFAULT_PROTOCOL
    sliding: str = DEFAULT_SLIDING  # what the method did with sliding-window layers: keep or compress

    @classmethod
    def of(cls, model: str, method: str, budget: str, task: str, context_length: int | None, seed: object,
           protocol: str = DEFAULT_PROTOCOL, sliding: str = DEFAULT_SLIDING) -> ItemKey:
        return cls(str(model), str(method), str(budget), task_label(str(task), context_length), f"seed{seed}",
                   str(protocol or DEFAULT_PROTOCOL), str(sliding or DEFAULT_SLIDING))

    @property
    def text(self) -> str:
        return "|".join((self.model, self.method, self.budget, self.task, self.seed)) + self._settings

    @property
    def configuration(self) -> str:
        """The key without its seed: what runs of one configuration over several seeds share."""
        return "|".join((self.model, self.method, self.budget, self.task)) + self._settings

    @property
    def _settings(self) -> str:
        return protocol_key_part(self.protocol) + sliding_key_part(self.sliding)

    @property
    def row(self) -> str:
        """The method as a table row names it: its label, marked when it compressed sliding-window layers too."""
        return self.method if self.sliding == DEFAULT_SLIDING else f"{self.method} (sliding {self.sliding})"

    @classmethod
    def parse(cls, text: str) -> ItemKey | None:
        """The parts of ``text``; None when it is not a key (fewer than five fields).

        Model ids and method labels may hold anything, but the last three fields cannot hold a ``|``, so
        the key is cut from the right (after a trailing protocol part): the model is the first field,
        the method the rest."""
        parts = text.split("|")
        protocol, sliding = DEFAULT_PROTOCOL, DEFAULT_SLIDING
        if parts[-1].startswith(_SLIDING_PREFIX):
            sliding = parts.pop()[len(_SLIDING_PREFIX):]
        if parts[-1].startswith(_PROTOCOL_PREFIX):
            protocol = parts.pop()[len(_PROTOCOL_PREFIX):]
        if len(parts) < 5:
            return None
        return cls(parts[0], "|".join(parts[1:-3]), parts[-3], parts[-2], parts[-1], protocol, sliding)
