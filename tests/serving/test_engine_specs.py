"""Engine specs (llamacpp:q8_0) in the one grammar, and the pieces of an engine row that need no engine.

The spec's cache types and byte fractions, its canonical spelling, the registry refusing to build it as a
transformers method; llama.cpp's log read into the cache it allocated; the agreement and top-n KL of an engine's
answer; the server response read into a Completion; where a quantized engine row stands among byte budgets.
"""

from __future__ import annotations

import math

import pytest

from kvmethods import MethodError, describe_method, get_method
from kvmethods.core.engine_caches import engine_caches
from kvmethods.spec import MethodSpec
from pytest_kvbench.results.record import Record, Serving
from pytest_kvbench.results.views.table_model import joins_table
from pytest_kvbench.serving.backend import CacheReport, EngineDied
from pytest_kvbench.serving.engine_fidelity import token_agreement, top_n_kl
from pytest_kvbench.serving.llamacpp.backend import completion_of, completion_request
from pytest_kvbench.serving.llamacpp.kv_report import agrees, cache_report

pytestmark = pytest.mark.transformers_independent


@pytest.mark.parametrize(("spec", "keys", "values", "canonical", "fraction"), [
    ("llamacpp:f16", "f16", "f16", "llamacpp:f16", 1.0),
    ("llamacpp:q8_0", "q8_0", "q8_0", "llamacpp:q8_0", 34 / 64),
    ("llamacpp:q4_0", "q4_0", "q4_0", "llamacpp:q4_0", 18 / 64),
    ("llamacpp:k=q8_0:v=q4_0", "q8_0", "q4_0", "llamacpp:k=q8_0:v=q4_0", (34 / 32 + 18 / 32) / 4),
    ("llamacpp:k=q8_0:v=q8_0", "q8_0", "q8_0", "llamacpp:q8_0", 34 / 64),
    ("llamacpp:q8_0:v=q4_0", "q8_0", "q4_0", "llamacpp:k=q8_0:v=q4_0", (34 / 32 + 18 / 32) / 4),
])
def test_an_engine_spec_names_its_cache_types_and_their_bytes(spec, keys, values, canonical, fraction):
    parsed = MethodSpec.parse(spec)
    assert parsed.is_engine
    caches = engine_caches(parsed.name, parsed.param_dict)
    assert (caches.keys, caches.values) == (keys, values)
    assert math.isclose(caches.byte_fraction, fraction)
    described = describe_method(parsed.name, **parsed.param_dict)
    assert str(parsed.respelled(described.name, described.params)) == canonical
    assert not described.capabilities  # no budget axis: one item per task, like `full`


def test_the_issue_s_byte_fractions_hold():
    assert round(engine_caches("llamacpp:q8_0", {}).byte_fraction, 2) == 0.53
    assert round(engine_caches("llamacpp:q4_0", {}).byte_fraction, 2) == 0.28


@pytest.mark.parametrize(("spec", "says"), [
    ("llamacpp:q3_k", "unknown llama.cpp cache type 'q3_k'"),
    ("llamacpp", "name the cache type"),
    ("llamacpp:k=q8_0", "name the cache type"),
    ("llamacpp:q8_0:bits=4", "unknown parameter 'bits'"),
    ("llamacpp:q8_0:q4_0", "name one cache type"),
])
def test_a_bad_engine_spec_is_one_line_naming_the_valid_types(spec, says):
    parsed = MethodSpec.parse(spec)
    with pytest.raises(MethodError, match=says) as error:
        describe_method(parsed.name, **parsed.param_dict)
    assert "\n" not in str(error.value)


def test_an_engine_spec_is_never_built_as_a_transformers_method():
    with pytest.raises(MethodError, match="runs in the engine"):
        get_method("llamacpp:f16")


LOG = """\
print_info: n_layer               = 6
print_info: n_head_kv             = 2
print_info: n_embd_head_k         = 64
print_info: n_embd_head_v         = 64
print_info: n_swa                 = 128
llama_kv_cache_iswa: creating non-SWA KV cache, size = 1024 cells
llama_kv_cache: size =    0.53 MiB (  1024 cells,   2 layers,  1/1 seqs), K (q8_0):    0.27 MiB, V (q8_0):    0.27 MiB
llama_kv_cache_iswa: creating     SWA KV cache, size = 256 cells
llama_kv_cache: size =    0.27 MiB (   256 cells,   4 layers,  1/1 seqs), K (q8_0):    0.13 MiB, V (q8_0):    0.13 MiB
"""


def test_the_engine_log_gives_the_cache_and_its_bytes_for_a_context():
    report = cache_report(LOG, "q8_0", "q8_0")
    per_token_layer = 2 * 2 * 64 * 34 / 32  # heads x (keys + values) x dim x q8_0's bytes per value
    assert report.bytes_per_token_layer == per_token_layer
    assert (report.layers, report.window_layers, report.window) == (2, 4, 128)
    assert report.allocated_bytes == round(per_token_layer * (1024 * 2 + 256 * 4))
    assert agrees(report)
    # 1000 tokens: the full layers hold them all, the window layers their last 128
    assert report.bytes_for(1000) == round(per_token_layer * (2 * 1000 + 4 * 128))
    assert not agrees(cache_report(LOG.replace("0.53 MiB", "0.93 MiB"), "q8_0", "q8_0"))
    assert cache_report("no geometry here", "f16", "f16") is None


def test_a_model_without_window_layers_holds_the_whole_context_in_each_layer():
    report = CacheReport(bytes_per_token_layer=216.0, layers=30)
    assert report.bytes_for(2048) == 216 * 30 * 2048


def test_agreement_counts_positions_over_the_longer_answer():
    assert token_agreement([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert token_agreement([1, 2, 3, 4], [1, 2, 9, 4]) == 0.75
    assert token_agreement([1, 2], [1, 2, 3, 4]) == 0.5
    assert token_agreement([], []) == 1.0


def test_the_top_n_kl_is_zero_for_the_same_answer_and_grows_with_the_difference():
    ref = [{5: math.log(0.7), 6: math.log(0.2)}, {7: math.log(0.9), 8: math.log(0.05)}]
    assert top_n_kl([5, 7], ref, [5, 7], ref) == pytest.approx(0.0, abs=1e-12)
    near = [{5: math.log(0.6), 6: math.log(0.3)}, {7: math.log(0.9), 8: math.log(0.05)}]
    far = [{6: math.log(0.6), 9: math.log(0.3)}, {7: math.log(0.9), 8: math.log(0.05)}]
    assert 0 < top_n_kl([5, 7], ref, [5, 7], near) < top_n_kl([5, 7], ref, [6, 7], far)
    # after the first differing token nothing counts: the second step's difference is left out
    other_second = [{5: math.log(0.7), 6: math.log(0.2)}, {8: math.log(0.9), 7: math.log(0.05)}]
    assert top_n_kl([5, 7], ref, [5, 8], other_second) > 0
    assert top_n_kl([5], ref[:1], [6], far[:1]) == pytest.approx(top_n_kl([5, 7], ref, [6, 7], far))
    assert top_n_kl([5], [], [5], []) is None


def test_the_request_is_token_ids_greedy_without_a_prompt_cache():
    request = completion_request([1, 2, 3], 16, 10)
    assert request["prompt"] == [1, 2, 3] and request["n_predict"] == 16 and request["temperature"] == 0.0
    assert request["cache_prompt"] is False and request["n_probs"] == 10


def _response(ids, finish="length", prompt_tokens=3):
    steps = [{"id": i, "logprob": -0.1, "top_logprobs": [{"id": i, "logprob": -0.1}, {"id": 0, "logprob": -3.0}]}
             for i in ids]
    return {"choices": [{"text": "", "finish_reason": finish, "logprobs": {"content": steps}}],
            "usage": {"prompt_tokens": prompt_tokens},
            "timings": {"prompt_ms": 12.5, "predicted_n": len(ids), "predicted_ms": 30.0,
                        "predicted_per_token_ms": 10.0}}


def test_an_answer_is_cut_at_the_benchmark_s_stop_token():
    done = completion_of(_response([4, 5, 2, 6]), 3, stop_ids=[2], wall_s=0.1)
    assert done.tokens == [4, 5] and done.stop_token == 2 and done.top_logprobs[0] == {4: -0.1, 0: -3.0}
    assert (done.ttft_ms, done.tpot_ms, done.prompt_tokens) == (12.5, 10.0, 3)
    long = completion_of(_response([4, 5, 6]), 3, stop_ids=[2], wall_s=0.1)
    assert long.stop_token is None and long.tokens == [4, 5, 6]
    own_stop = completion_of(_response([4], finish="stop"), 3, stop_ids=[2], wall_s=0.1)
    assert own_stop.stop_token is not None  # llama.cpp's own end-of-generation token ended it


def test_an_error_answer_is_the_engine_s_failure():
    with pytest.raises(EngineDied, match="error"):
        completion_of({"error": {"message": "context too long"}}, 3, [2], 0.1)


def _engine_record(fraction: float | None) -> Record:
    return Record(key="m|llamacpp:q8_0|full|t|seed0", model=None, method=None, budget=None, task=None,
                  serving=None if fraction is None else Serving(engine="llama.cpp", byte_fraction=fraction))


@pytest.mark.parametrize(("fraction", "tables"), [
    (34 / 64, ["m0.5"]), (18 / 64, ["m0.25"]), (1.0, ["m0.25", "m0.5", "128"]), (None, ["m0.25", "m0.5", "128"])])
def test_an_engine_row_joins_the_byte_budget_nearest_its_size(fraction, tables):
    budgets = ["m0.25", "m0.5", "128"]
    record = _engine_record(fraction)
    assert [b for b in budgets if joins_table(record, b, budgets)] == tables
    assert joins_table(record, "128", ["128"])  # no byte budget: every table
