"""pytest-benchmark timings of the compression kernels on the performance-target model.

One layer of the tiny Llama (hidden 256, 8 query / 2 KV heads) with a 4,096-token prompt: each method's
selection (scoring + top-k) at a 1,024-token budget, the two attention-recomputation kernels, and one
plain decoder-layer forward for scale. No assertions on time; compare with `pytest-benchmark compare`.
scripts/measure/measure_methods.py reports the end-to-end ratios against a plain prefill.

    pytest bench/test_kernels.py -p no:kvbench --benchmark-timer time.process_time

torch, transformers and the kernels come through fixtures, imported when a benchmark runs: collecting
bench/ (the whole grid of every suite) must not pay for them.
"""

import importlib

import pytest

from kvmethods import get_method

PROMPT_LEN, BUDGET = 4096, 1024
METHODS = ["snapkv", "pyramidkv", "tova", "knorm", "streamingllm", "random", "h2o"]


@pytest.fixture(scope="module")
def torch():
    return importlib.import_module("torch")


@pytest.fixture(scope="module")
def scoring():
    return importlib.import_module("kvmethods.scorers.scoring")


@pytest.fixture(scope="module")
def layer_inputs(torch):
    """What the compression hook sees for layer 0 at the end of a 4,096-token prefill."""
    # lazy for collection time: transformers and the tiny model are only needed when the benchmark runs
    from kvmethods.testing import bench_model, first_layer_inputs

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    model = bench_model()
    ids = torch.randint(3, 32000, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(0))
    yield model, first_layer_inputs(model, ids, grad_mode=torch.inference_mode, logits_to_keep=1)
    torch.set_num_threads(previous)


@pytest.mark.parametrize("method_name", METHODS)
def test_method_selection(benchmark, torch, layer_inputs, method_name):
    _, inputs = layer_inputs
    method = get_method(method_name)
    with torch.inference_mode():
        kept = benchmark(method.kept_indices, inputs, BUDGET)
    assert kept.shape == (1, inputs.num_kv_heads, BUDGET)


def test_window_attention_32(benchmark, torch, scoring, layer_inputs):
    _, inputs = layer_inputs
    with torch.inference_mode():
        probs = benchmark(scoring.window_attention, inputs, 32)
    assert probs.shape[-1] == PROMPT_LEN


def test_accumulated_attention(benchmark, torch, scoring, layer_inputs):
    _, inputs = layer_inputs
    with torch.inference_mode():
        totals = benchmark.pedantic(scoring.accumulated_attention, args=(inputs,), rounds=3, iterations=1)
    assert totals.shape == (1, inputs.num_kv_heads, PROMPT_LEN)


def test_plain_layer_forward_for_scale(benchmark, torch, layer_inputs):
    """One decoder layer's prefill forward (attention + MLP), the unit a method's overhead adds to."""
    model, inputs = layer_inputs
    layer = model.model.layers[0]
    hidden = torch.randn(1, PROMPT_LEN, model.config.hidden_size)
    with torch.inference_mode():
        out = benchmark.pedantic(layer, args=(hidden,), kwargs={"position_embeddings": (inputs.cos, inputs.sin)},
                                 rounds=3, iterations=1)
    assert out.shape == hidden.shape
