"""What a serving engine must do for the benchmark: the small interface llama.cpp implements (llamacpp/backend.py)
and a vLLM backend could (docs/gpus.md).

The benchmark hands the engine the prompt's token ids, never text (the engine's tokenizer could split it
otherwise), asks for greedy tokens up to the task's max_new_tokens, and reads back the tokens, the top-n log-probs
of each step and the engine's own timings. An engine that dies raises EngineDied: that item errors and the pool
starts a new engine for the next one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol


class EngineDied(RuntimeError):
    """The engine stopped answering (its process died, or the call failed): the item's error, one paragraph."""


class EngineStartError(RuntimeError):
    """The engine would not start with these settings (the model, the cache types): one paragraph."""


@dataclass(frozen=True)
class EngineSettings:
    """What one engine instance is started with; the pool keeps one per distinct value."""

    model_file: str  # the GGUF file (llama.cpp) or model folder the engine loads
    cache_type_k: str  # the engine's own names: f16, q8_0, q4_0 (llama.cpp); fp8, fp8_e5m2 (vLLM)
    cache_type_v: str
    context_tokens: int  # the context the engine reserves (prompt + answer of the longest item)
    threads: int = 1  # CPU threads (llama.cpp); a GPU engine ignores it


@dataclass
class Completion:
    """One prompt's greedy answer as the engine gave it."""

    tokens: list[int]  # the generated token ids, the stopping token left out
    stop_token: int | None  # the token that ended it (eos), None when max_new_tokens did
    top_logprobs: list[dict[int, float]]  # per generated step: the engine's top-n log-probs (may be empty)
    prompt_tokens: int
    ttft_ms: float  # the engine's time to first token: its prompt processing
    tpot_ms: float | None  # the engine's time per output token after the first (None: nothing decoded)
    decode_ms: float  # the engine's decoding time of the output tokens
    wall_s: float = 0.0  # the call's wall time as the backend saw it (its overhead over the engine's own figures)
    engine: dict = field(default_factory=dict)  # what else the engine said (its raw timings)


@dataclass(frozen=True)
class CacheReport:
    """The KV cache an engine says it allocated: per cache (llama.cpp: one, or a full and a sliding-window one)."""

    bytes_per_token_layer: float  # of keys and values, from the cache types' blocks and the model's geometry
    layers: int  # layers holding every token
    window_layers: int = 0  # sliding-window layers, holding at most `window` tokens
    window: int | None = None
    reported_bytes: int | None = None  # the engine's own figure for its allocation
    allocated_bytes: int | None = None  # the same allocation computed from the blocks (checked against reported)

    def bytes_for(self, tokens: int) -> int:
        """The cache's bytes for a context of `tokens`."""
        held = min(tokens, self.window) if self.window else tokens
        return round(self.bytes_per_token_layer * (self.layers * tokens + self.window_layers * held))


class ServingBackend(Protocol):
    """One engine instance: started with EngineSettings, answering prompts until closed."""

    name: str  # the engine's name in records: "llama.cpp"
    settings: EngineSettings

    def start(self) -> None: ...

    def complete(self, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: Sequence[int],
                 top_n: int) -> Completion: ...

    def cache_report(self) -> CacheReport | None: ...

    @property
    def alive(self) -> bool: ...

    def close(self) -> None: ...
