"""One engine per worker and cache types, started once and reused across the worker's items.

Starting an engine loads the model (seconds), so a worker keeps each engine it started, keyed by model file and
cache types, as the engine's model cache keeps models. An item that needs a longer context than an engine
reserved gets it restarted with room; an engine that died is dropped (its item errors) and the next item that
needs it starts a new one. The pool closes its engines at the end of the session (and at exit).
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from dataclasses import replace

from pytest_kvbench.serving.backend import EngineSettings, ServingBackend

CONTEXT_STEP = 256  # reserved contexts rounded up to this: items of one length share an engine


def reserved_context(tokens: int) -> int:
    return -(-max(tokens, 1) // CONTEXT_STEP) * CONTEXT_STEP


class EnginePool:
    """The worker's engines: `get` one for settings, `drop` one that died, `close` them all."""

    def __init__(self, make: Callable[[EngineSettings], ServingBackend]) -> None:
        self._make = make
        self._engines: dict[tuple, ServingBackend] = {}
        self.started = 0  # engines started by this pool (restarts included)
        atexit.register(self.close)

    @staticmethod
    def _key(settings: EngineSettings) -> tuple:
        return settings.model_file, settings.cache_type_k, settings.cache_type_v, settings.threads

    def get(self, settings: EngineSettings) -> tuple[ServingBackend, bool]:
        """(a running engine for `settings` with at least its context, whether it started now)."""
        key = self._key(settings)
        engine = self._engines.get(key)
        if engine is not None and engine.alive and engine.settings.context_tokens >= settings.context_tokens:
            return engine, False
        if engine is not None:
            self.drop(engine)
        engine = self._make(replace(settings, context_tokens=reserved_context(settings.context_tokens)))
        engine.start()  # EngineStartError: nothing kept, the next item tries again
        self.started += 1
        self._engines[key] = engine
        return engine, True

    def drop(self, engine: ServingBackend) -> None:
        """An engine closed and forgotten (it died, or needs a longer context)."""
        self._engines = {key: kept for key, kept in self._engines.items() if kept is not engine}
        engine.close()

    def close(self) -> None:
        engines, self._engines = list(self._engines.values()), {}
        for engine in engines:
            engine.close()
