"""The shared-context and multi-turn protocols (kvmethods/runtime/protocols/) on tiny models.

What makes their numbers trustworthy: with the full cache they answer exactly what one prefill per
question (or plain multi-turn greedy generation over the growing history) answers, and a compressed
context is put back bitwise between questions, so no question sees another one's tokens.
"""

import pytest
import torch

from kvmethods import get_method
from kvmethods.runtime.generation import generate, prefill
from kvmethods.runtime.protocols import answer_questions, run_turns
from kvmethods.runtime.protocols.cache_snapshot import CacheSnapshot
from kvmethods.runtime.protocols.shared_context import ask
from kvmethods.testing import tiny_model
from model_helpers import one_thread  # noqa: F401 (a module-scoped autouse fixture: applies here)

NO_COMPRESSION = "r0"
EOS = {1}


def tokens(seed: int, n: int) -> list[int]:
    return torch.randint(3, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


CONTEXT = tokens(1, 80)
QUESTIONS = [tokens(2, 6), tokens(3, 9), tokens(4, 4)]


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model(request):
    return tiny_model(request.param, seed=5, qk_scale=4.0)


def test_shared_context_with_full_cache_answers_as_one_prefill_per_question(model):
    shared = answer_questions(model, get_method("full"), NO_COMPRESSION, CONTEXT, QUESTIONS, 8, EOS)
    for question, out in zip(QUESTIONS, shared):
        alone = generate(model, get_method("full"), NO_COMPRESSION, CONTEXT + question, len(CONTEXT), 8, EOS,
                         "query_agnostic")
        assert out.tokens == alone.tokens and len(out.tokens) == 8
        assert out.prompt_tokens == len(CONTEXT) + len(question)


@pytest.mark.parametrize("method", ["snapkv", "pyramidkv", "adakv", "kvzip"])
def test_shared_context_with_compression_answers_as_the_same_compressed_context_per_question(model, method):
    """Query-agnostic compression of the context alone, then the question: the same per question
    whether the context was compressed once for all of them or once for each."""
    shared = answer_questions(model, get_method(method), "24", CONTEXT, QUESTIONS, 6, EOS)
    for question, out in zip(QUESTIONS, shared):
        alone = generate(model, get_method(method), "24", CONTEXT + question, len(CONTEXT), 6, EOS, "query_agnostic")
        assert out.tokens == alone.tokens
        assert out.kept_tokens_per_layer == alone.kept_tokens_per_layer
        assert out.kept_tokens_per_layer[0] < len(CONTEXT)


@pytest.mark.parametrize("method", ["snapkv", "pyramidkv", "adakv"])
def test_the_compressed_context_is_restored_bitwise_after_a_question(model, method):
    state = prefill(model, get_method(method), "24", CONTEXT, len(CONTEXT), "query_agnostic")
    before = [(layer.keys.clone(), layer.values.clone()) for layer in state.cache.layers]
    snapshot = CacheSnapshot.take(state.cache)
    asked = ask(model, state, QUESTIONS[0])
    assert state.cache.layers[0].keys.shape[-2] > before[0][0].shape[-2]  # the question went in
    snapshot.restore(asked.cache)
    for layer, (keys, values) in zip(state.cache.layers, before):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)


@pytest.mark.parametrize("method", ["kivi", "snapkv+kivi", "think"])
def test_shared_context_restores_stores_that_rewrite_themselves_on_append(model, method):
    """KIVI moves its full-precision window into codes every `residual` tokens: cutting the tail back would
    leave the codes of a question behind (the next forward then failed on mismatched lengths)."""
    params = dict(bits=2, group_size=4, residual=4) if "kivi" in method else {}
    budget = "r0" if method != "snapkv+kivi" else "24"
    shared = answer_questions(model, get_method(method, **params), budget, CONTEXT, QUESTIONS, 8, set())
    for question, out in zip(QUESTIONS, shared):
        alone = generate(model, get_method(method, **params), budget, CONTEXT + question, len(CONTEXT), 8, set(),
                         "query_agnostic")
        assert out.tokens == alone.tokens


def test_multi_turn_with_full_cache_equals_plain_greedy_generation_over_the_history(model):
    turns = run_turns(model, get_method("full"), NO_COMPRESSION, CONTEXT, QUESTIONS, 7, EOS)
    history = list(CONTEXT)
    for question, out in zip(QUESTIONS, turns):
        history += question
        plain = generate(model, get_method("full"), NO_COMPRESSION, history, len(history), 7, EOS,
                         "question_in_window")
        assert out.tokens == plain.tokens and out.prompt_tokens == len(history)
        history += plain.tokens


def test_multi_turn_keeps_earlier_turns_in_the_cache(model):
    """The second turn's answer depends on the first turn: not the same as asking it alone."""
    turns = run_turns(model, get_method("snapkv"), "24", CONTEXT, QUESTIONS[:2], 7, EOS)
    alone = answer_questions(model, get_method("snapkv"), "24", CONTEXT, QUESTIONS[:2], 7, EOS)
    assert turns[0].tokens == alone[0].tokens
    assert turns[1].prompt_tokens == len(CONTEXT) + len(QUESTIONS[0]) + 7 + len(QUESTIONS[1])
    assert turns[1].kept_tokens_per_layer[0] == alone[1].kept_tokens_per_layer[0] + len(QUESTIONS[0]) + 7


# -- compression while decoding (kvmethods/decoding/decoding_compression.py, kvmethods/decoding/rkv.py) -----------------------

@pytest.mark.parametrize("spec", [dict(name="decoding", base="snapkv", interval=16, window=8),
                                  dict(name="decoding", base="streamingllm", interval=10),
                                  dict(name="decoding", base="knorm", interval=12),
                                  dict(name="rkv", interval=16)])
def test_decoding_compression_never_lets_the_cache_exceed_budget_plus_interval(model, spec):
    params = dict(spec)
    method = get_method(params.pop("name"), **params)
    out = generate(model, method, "24", CONTEXT, len(CONTEXT), 60, set(), "question_in_window")
    lengths = out.decode_cache_lengths
    assert len(out.tokens) == 60 and len(lengths) == 59  # the last token is never fed back
    assert max(lengths) <= 24 + spec["interval"] and max(lengths) == 24 + spec["interval"] - 1
    assert min(lengths) == 24  # it was cut back to the budget at least once
    assert out.kept_tokens_per_layer == [24] * len(out.kept_tokens_per_layer)


@pytest.mark.parametrize("name", ["decoding", "rkv"])
def test_decoding_compression_with_a_budget_above_the_final_length_is_no_compression(model, name):
    method = get_method(name, interval=8, window=8)
    out = generate(model, method, "1000", CONTEXT, len(CONTEXT), 30, set(), "question_in_window")
    full = generate(model, get_method("full"), "1000", CONTEXT, len(CONTEXT), 30, set(), "question_in_window")
    assert out.tokens == full.tokens
    assert out.decode_cache_lengths == list(range(len(CONTEXT) + 1, len(CONTEXT) + 30))


def test_decoding_compression_changes_what_is_generated_once_it_cuts(model):
    """The cut is real: with a tight budget decoding goes differently than prefill-only compression."""
    cut = generate(model, get_method("decoding", base="knorm", interval=4), "16", CONTEXT, len(CONTEXT), 40, set(),
                   "question_in_window")
    prefill_only = generate(model, get_method("knorm"), "16", CONTEXT, len(CONTEXT), 40, set(), "question_in_window")
    assert prefill_only.decode_cache_lengths == [] and cut.tokens != prefill_only.tokens


@pytest.mark.parametrize("spec", [dict(name="decoding", base="h2o"), dict(name="decoding", base="kvzip"),
                                  dict(name="decoding", base="adakv"), dict(name="decoding", interval=16),
                                  dict(name="rkv", interval=0), dict(name="decoding", interval=0)])
def test_decoding_compression_refuses_scorers_and_intervals_it_cannot_use(spec):
    from kvmethods import MethodError

    params = dict(spec)
    with pytest.raises(MethodError) as error:
        get_method(params.pop("name"), **params)
    assert "\n" not in str(error.value)


def test_multi_turn_after_an_eos_stop_equals_plain_greedy_generation_over_the_history(model):
    """A turn that stops at eos fed all its tokens already: the next turn starts right after them."""
    eos = {run_turns(model, get_method("full"), NO_COMPRESSION, CONTEXT, QUESTIONS[:1], 7, set())[0].tokens[2]}
    turns = run_turns(model, get_method("full"), NO_COMPRESSION, CONTEXT, QUESTIONS, 7, eos)
    assert turns[0].stop_token in eos and len(turns[0].tokens) == 2
    history = list(CONTEXT)
    for question, out in zip(QUESTIONS, turns):
        history += question
        plain = generate(model, get_method("full"), NO_COMPRESSION, history, len(history), 7, eos, "question_in_window")
        assert out.tokens == plain.tokens
        history += plain.tokens


# -- fidelity under the group protocols: teacher forcing on the full cache's answers ---------------------------

def targets(outs) -> list[list[int]]:
    return [out.tokens + ([out.stop_token] if out.stop_token is not None else []) for out in outs]


@pytest.mark.parametrize("protocol", [answer_questions, run_turns])
def test_full_cache_teacher_forced_on_its_own_answers_reproduces_its_distributions(model, protocol):
    reference = protocol(model, get_method("full"), NO_COMPRESSION, CONTEXT, QUESTIONS, 6, EOS, return_logprobs=True)
    forced = protocol(model, get_method("full"), NO_COMPRESSION, CONTEXT, QUESTIONS, 6, EOS,
                      teacher_targets=targets(reference))
    for ref, out in zip(reference, forced):
        assert ref.logprobs.shape == out.target_logprobs.shape
        torch.testing.assert_close(out.target_logprobs, ref.logprobs, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("method", ["snapkv", "knorm"])
def test_shared_context_teacher_forcing_equals_one_prompt_teacher_forcing(model, method):
    reference = answer_questions(model, get_method("full"), NO_COMPRESSION, CONTEXT, QUESTIONS, 6, EOS,
                                 return_logprobs=True)
    shared = answer_questions(model, get_method(method), "24", CONTEXT, QUESTIONS, 6, EOS,
                              teacher_targets=targets(reference))
    for question, target, out in zip(QUESTIONS, targets(reference), shared):
        alone = generate(model, get_method(method), "24", CONTEXT + question, len(CONTEXT), 6, EOS, "query_agnostic",
                         teacher_targets=target)
        torch.testing.assert_close(out.target_logprobs, alone.target_logprobs)
        assert not torch.allclose(out.target_logprobs, torch.zeros_like(out.target_logprobs))


@pytest.mark.parametrize("method", ["snapkv", "snapkv:per_turn"])
def test_multi_turn_teacher_forcing_holds_the_references_history(model, method):
    """Turn k is teacher-forced on context + q1 + ref_a1 + ... + qk, whatever the method itself answered."""
    reference = run_turns(model, get_method("full"), NO_COMPRESSION, CONTEXT, QUESTIONS, 6, set(), return_logprobs=True)
    per_turn = method.endswith("per_turn")
    forced = run_turns(model, get_method("snapkv", per_turn=per_turn), "24", CONTEXT, QUESTIONS, 6, set(),
                       teacher_targets=targets(reference))
    history = []
    for question, target, out in zip(QUESTIONS, targets(reference), forced):
        history += question
        alone = generate(model, get_method("snapkv"), "24", CONTEXT + history, len(CONTEXT), 6, set(), "query_agnostic",
                         teacher_targets=target)
        same = torch.allclose(out.target_logprobs, alone.target_logprobs, atol=1e-5)
        assert same != (per_turn and question is not QUESTIONS[0])  # re-compression changes later turns only
        history += target


# -- re-compression after each turn (kvmethods/wrappers/per_turn.py) ------------------------------------------------------

@pytest.mark.parametrize("name", ["snapkv", "streamingllm", "knorm", "rkv"])
def test_per_turn_cuts_the_cache_back_to_the_budget_after_every_turn(model, name):
    turns = run_turns(model, get_method(name, per_turn=True), "24", CONTEXT, QUESTIONS, 7, set())
    plain = run_turns(model, get_method(name), "24", CONTEXT, QUESTIONS, 7, set())
    layers = len(turns[0].kept_tokens_per_layer)
    assert turns[0].kept_tokens_per_layer == plain[0].kept_tokens_per_layer == [24 + len(QUESTIONS[0])] * layers
    for question, out, grown in zip(QUESTIONS[1:], turns[1:], plain[1:]):
        # the turn starts from the budget: the previous turn was cut back; + the last answer token and the question
        assert out.kept_tokens_per_layer == [24 + 1 + len(question)] * layers
        assert grown.kept_tokens_per_layer[0] > out.kept_tokens_per_layer[0]


def test_the_cut_back_after_a_turn_is_booked_in_that_turns_decode_time(model, monkeypatch):
    """A clock that moves only while a layer is cut back: each turn's decode_s is its cuts' time, so a per_turn
    cut is never lost between turns (nor counted in the next question's prefill)."""
    import kvmethods.decoding.decoding_compression as decoding_compression
    import kvmethods.runtime.protocols.multi_turn as multi_turn
    import kvmethods.runtime.protocols.shared_context as shared_context

    clock = [0.0]
    cut = decoding_compression.store_selection

    def slow_cut(*args, **kwargs):
        clock[0] += 1.0
        return cut(*args, **kwargs)

    for module in (multi_turn, shared_context):
        monkeypatch.setattr(module, "now", lambda: clock[0])  # the runtime clock (kvmethods/core/clock.py)
    monkeypatch.setattr(decoding_compression, "store_selection", slow_cut)
    turns = run_turns(model, get_method("snapkv", per_turn=True), "24", CONTEXT, QUESTIONS, 7, set())
    layers = len(turns[0].kept_tokens_per_layer)
    assert [out.decode_s for out in turns] == [float(layers)] * len(QUESTIONS)  # every layer cut after each turn
    assert all(out.prefill_s == 0.0 for out in turns[1:])


@pytest.mark.parametrize("name", ["snapkv", "knorm"])
def test_per_turn_with_a_budget_above_the_final_length_is_plain_multi_turn(model, name):
    turns = run_turns(model, get_method(name, per_turn=True), "1000", CONTEXT, QUESTIONS, 7, EOS)
    plain = run_turns(model, get_method(name), "1000", CONTEXT, QUESTIONS, 7, EOS)
    assert [out.tokens for out in turns] == [out.tokens for out in plain]
    assert [out.kept_tokens_per_layer for out in turns] == [out.kept_tokens_per_layer for out in plain]


def test_per_turn_is_a_parameter_of_the_methods_identity():
    assert get_method("snapkv", per_turn="true").params() == get_method("snapkv").params() | {"per_turn": True}
    assert get_method("snapkv", per_turn=False) == get_method("snapkv")
    assert get_method("snapkv", per_turn=True, prefill_chunk=16).params()["prefill_chunk"] == 16


@pytest.mark.parametrize("name", ["full", "h2o", "kvzip", "adakv", "kivi", "snapkv+kivi"])
def test_per_turn_refuses_methods_that_cannot_cut_back_from_recent_queries(name):
    from kvmethods import MethodError

    with pytest.raises(MethodError) as error:
        get_method(name, per_turn=True)
    assert "\n" not in str(error.value) and "per_turn" in str(error.value)


# -- gold history: answers leave the cache (SCBench's default) ----------------------------------------------------

@pytest.mark.parametrize("spec", [dict(name="full"), dict(name="snapkv"), dict(name="adakv"),
                                  dict(name="decoding", base="knorm", interval=4),
                                  dict(name="rkv", interval=8, window=8)])
def test_without_kept_answers_turn_k_answers_as_the_context_plus_every_question_so_far(model, spec):
    """MInference scbench/eval_utils.py GreedySearch._decode: with golden context, decoding does not update
    the conversation's cache, so turn k is context + q1 + ... + qk (the caller puts each gold answer in the
    next question): equal to one query-agnostic prompt holding them all, the context compressed alike.
    Methods cutting the cache while decoding (decoding, rkv) decode each answer on a copy of the cache."""
    params = dict(spec)
    name = params.pop("name")
    budget = NO_COMPRESSION if name == "full" else "16"
    turns = run_turns(model, get_method(name, **params), budget, CONTEXT, QUESTIONS, 12, set(), keep_answers=False)
    history = []
    for question, out in zip(QUESTIONS, turns):
        history += question
        alone = generate(model, get_method(name, **params), budget, CONTEXT + history, len(CONTEXT), 12, set(),
                         "query_agnostic")
        assert out.tokens == alone.tokens and out.prompt_tokens == len(CONTEXT) + len(history)
        assert out.decode_cache_lengths == alone.decode_cache_lengths


def test_without_kept_answers_teacher_forcing_holds_only_the_questions(model):
    reference = run_turns(model, get_method("full"), NO_COMPRESSION, CONTEXT, QUESTIONS, 6, set(), return_logprobs=True,
                          keep_answers=False)
    forced = run_turns(model, get_method("snapkv"), "24", CONTEXT, QUESTIONS, 6, set(),
                       teacher_targets=targets(reference), keep_answers=False)
    history = []
    for question, target, out in zip(QUESTIONS, targets(reference), forced):
        history += question
        alone = generate(model, get_method("snapkv"), "24", CONTEXT + history, len(CONTEXT), 6, set(), "query_agnostic",
                         teacher_targets=target)
        torch.testing.assert_close(out.target_logprobs, alone.target_logprobs)
