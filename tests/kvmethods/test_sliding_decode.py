"""An uncompressed cache's sliding layers decode over their window (runtime/sliding_decode.py): the tokens and
log-probs of decoding the whole layers, and of the model's own generate; the records' sizes are the prefill's."""

from __future__ import annotations

import copy

import pytest
import torch

from kvmethods import FULL_CACHE, get_method
from kvmethods.adapters.transformers_compat import DynamicSlidingWindowLayer
from kvmethods.runtime.generation import decode_greedy, generate, prefill
from kvmethods.runtime.sliding_decode import windowed_for_decoding
from kvmethods.testing import WINDOW, family_model, tiny_model

PROMPT = list(range(3, 3 + 3 * WINDOW))  # three windows of the tiny hybrids
NEW = 8


@pytest.fixture(scope="module", params=["gemma3_text", "gpt_oss"])
def hybrid(request):
    return family_model(request.param)


def test_sliding_layers_become_their_window_the_global_ones_stay(hybrid):
    state = prefill(hybrid, get_method("full"), FULL_CACHE, PROMPT, len(PROMPT), "question_in_window")
    assert windowed_for_decoding(hybrid, state.cache) == 1
    sliding, full = state.cache.layers  # the tiny hybrids: a sliding layer, then a global one
    assert isinstance(sliding, DynamicSlidingWindowLayer) and sliding.keys.shape[-2] == WINDOW - 1
    assert sliding.get_seq_length() == len(PROMPT) and full.keys.shape[-2] == len(PROMPT)


def test_windowed_decode_gives_the_whole_layers_tokens_and_log_probs(hybrid):
    state = prefill(hybrid, get_method("full"), FULL_CACHE, PROMPT, len(PROMPT), "question_in_window")
    whole = copy.deepcopy(state)
    tokens, stop, steps, _ = decode_greedy(hybrid, whole, NEW, set(), True)
    windowed_for_decoding(hybrid, state.cache)
    again, stop_again, steps_again, _ = decode_greedy(hybrid, state, NEW, set(), True)
    assert (again, stop_again) == (tokens, stop)
    torch.testing.assert_close(torch.stack(steps_again), torch.stack(steps), atol=1e-5, rtol=0)


def test_generate_decodes_the_window_as_the_models_own_generate_and_measures_the_prefill(hybrid):
    eos = hybrid.config.eos_token_id
    out = generate(hybrid, get_method("full"), FULL_CACHE, PROMPT, len(PROMPT), NEW, {eos}, "question_in_window",
                   return_logprobs=True)
    own = hybrid.generate(torch.tensor([PROMPT]), max_new_tokens=NEW, do_sample=False, output_logits=True,
                          return_dict_in_generate=True)
    assert out.tokens + ([eos] if out.stop_token is not None else []) == own.sequences[0, len(PROMPT):].tolist()
    torch.testing.assert_close(out.logprobs, torch.log_softmax(torch.stack(own.logits)[:, 0].float(), -1),
                               atol=1e-5, rtol=0)
    assert out.kept_tokens_per_layer == [len(PROMPT)] * 2  # measured before the sliding layer is cut


def test_a_model_without_sliding_layers_keeps_its_cache():
    model = tiny_model()
    state = prefill(model, get_method("full"), FULL_CACHE, PROMPT, len(PROMPT), "question_in_window")
    before = [layer.keys for layer in state.cache.layers]
    assert windowed_for_decoding(model, state.cache) == 0
    assert all(layer.keys is keys for layer, keys in zip(state.cache.layers, before))
