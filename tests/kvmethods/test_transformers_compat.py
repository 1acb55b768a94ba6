"""kvmethods.adapters.transformers_compat: our forwards hand the cache to transformers under the name the installed
version expects, and nothing we run makes transformers warn about a deprecated calling convention (each such
warning is a rename that breaks us in a later version). Runs in both CI environments (5.2 and 5.24)."""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager

import pytest
import torch

from kvmethods import Budget, get_method
from kvmethods.runtime.generation import decode_greedy, generate
from kvmethods.runtime.shared_prefill import shared_prefill
from kvmethods.testing import tiny_model
from kvmethods.adapters.transformers_compat import DynamicCache, cache_argument, cache_from_kwargs
from model_helpers import one_thread  # noqa: F401 (a module-scoped autouse fixture: applies here)

PROMPT = torch.randint(5, 200, (48,), generator=torch.Generator().manual_seed(4)).tolist()
CONTEXT_LEN = 36


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=3, qk_scale=4.0)


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def deprecations() -> list[str]:
    """Collects what transformers says is deprecated while active: Future/DeprecationWarnings (generate's
    renamed kwargs) and its logger's warnings (5.24 logs the past_key_values rename once per process, so
    that once-cache is cleared first)."""
    found: list[str] = []
    logger = logging.getLogger("transformers")
    handler = _Records()
    once = getattr(logging.Logger.warning_once, "cache_clear", None)  # transformers' lru_cached warning_once
    if once is not None:
        once()
    logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield found
    finally:
        logger.removeHandler(handler)
    found.extend(f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught
                 if issubclass(w.category, (FutureWarning, DeprecationWarning)))
    found.extend(message for message in handler.messages if "deprecat" in message.lower())


def test_the_detector_sees_transformers_deprecation_of_past_key_values(model):
    """The check below can fail: the old keyword is reported where transformers deprecates it (5.24 on);
    where it is still the keyword (5.2), the new one does not exist and past_key_values is ours."""
    cache = DynamicCache()
    with deprecations() as found, torch.no_grad():
        model(torch.tensor([PROMPT]), past_key_values=cache, use_cache=True)
    assert cache.get_seq_length() == len(PROMPT)
    assert bool(found) == (cache_argument(model, None) == {"cache": None}), found


@pytest.mark.parametrize("method", ["snapkv", "adakv", "kvzip", "streamingllm"])
def test_prefill_and_decode_with_a_method_make_transformers_warn_nothing(model, method):
    with deprecations() as found, torch.no_grad():
        out = generate(model, get_method(method), Budget.parse("12"), PROMPT, CONTEXT_LEN, 4, set(),
                       "question_in_window", return_logprobs=True)
    assert len(out.tokens) == 4
    assert found == []


def test_the_shared_prefill_makes_transformers_warn_nothing(model):
    requests = [(get_method("snapkv"), Budget.parse("12")), (get_method("adakv"), Budget.parse("r0.5"))]
    with deprecations() as found, torch.no_grad():
        shared = shared_prefill(model, requests, PROMPT, CONTEXT_LEN, "query_agnostic")
        outputs = [decode_greedy(model, state, 3, set())[0] for state in shared.selections]
    assert shared.errors == [None, None] and all(len(tokens) == 3 for tokens in outputs)
    assert found == []


def test_the_cache_argument_is_the_one_the_model_fills(model):
    cache = DynamicCache()
    with torch.no_grad():
        model(torch.tensor([PROMPT]), use_cache=True, **cache_argument(model, cache))
        decoder = model.get_decoder()
        decoder(input_ids=torch.tensor([PROMPT[:5]]), position_ids=torch.arange(48, 53).unsqueeze(0),
                use_cache=True, **cache_argument(decoder, cache))
    assert cache.get_seq_length() == len(PROMPT) + 5


def test_a_hook_finds_the_cache_under_either_name(model):
    cache, seen = DynamicCache(), []
    handle = model.model.layers[0].self_attn.register_forward_hook(
        lambda module, args, kwargs, output: seen.append(cache_from_kwargs(kwargs)), with_kwargs=True)
    try:
        with torch.no_grad():
            model(torch.tensor([PROMPT]), use_cache=True, **cache_argument(model, cache))
    finally:
        handle.remove()
    assert seen == [cache]
    assert cache_from_kwargs({"past_key_values": cache}) is cache and cache_from_kwargs({}) is None
