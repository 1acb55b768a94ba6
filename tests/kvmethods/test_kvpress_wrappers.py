"""chunkkv, merge and simlayerkv against kvpress' ChunkKVPress, MergingPress and SimLayerKVPress with equal settings
(kvpress extra only: CI's second environment).

Kept positions per (layer, KV head) are read back as test_kvpress_adapter.py reads them: our kept indices, and the
press's compressed rows matched to the full cache's rows. Budgets are whole chunks for chunkkv (kvpress keeps whole
chunks, kvmethods exactly the budget: equal when the budget is a whole number of chunks). For merge the stored
values are compared too: the merged ones, and that merging changed some.
"""

import pytest
import torch

kvpress = pytest.importorskip("kvpress")

from kvmethods import Budget, get_method  # noqa: E402
from kvmethods.runtime.generation import prefill  # noqa: E402
from test_kvpress_adapter import model, native_kept, press_kept, prompt  # noqa: E402, F401 (model: the fixture)
from model_helpers import one_thread  # noqa: E402, F401 (one_thread applies here)

CHUNKKV = [
    (("chunkkv", {"base": "knorm", "chunk_length": 8}), ("kvpress:ChunkKVPress", {"press": "KnormPress",
                                                                                   "chunk_length": 8})),
    (("chunkkv", {"base": "snapkv", "window": 8, "kernel": 5, "chunk_length": 8}),
     ("kvpress:ChunkKVPress", {"press": "SnapKVPress", "press.window_size": 8, "press.kernel_size": 5,
                               "chunk_length": 8})),
    (("chunkkv", {"base": "tova", "chunk_length": 12}), ("kvpress:ChunkKVPress", {"press": "TOVAPress",
                                                                                  "chunk_length": 12})),
]


@pytest.mark.parametrize("native, press", CHUNKKV, ids=[f"{n[1]['base']}-{n[1]['chunk_length']}" for n, _ in CHUNKKV])
@pytest.mark.parametrize("budget", ["r0.5", "48"])  # 96 tokens: whole chunks of 8 and 12 either way
def test_chunkkv_keeps_the_chunks_chunkkvpress_keeps(model, native, press, budget):
    ids = prompt(model.config.vocab_size)
    ours = native_kept(model, get_method(native[0], **native[1]), budget, ids)
    theirs = press_kept(model, get_method(press[0], **press[1]), budget, ids)
    assert ours == theirs
    chunk = native[1]["chunk_length"]
    for layer in ours:  # every head keeps the same whole chunks
        assert all(head == layer[0] for head in layer)
        assert {position // chunk for position in layer[0]} == {p // chunk for p in layer[0] if p % chunk == 0}


def kept_rows(model, method, budget, ids):
    """Per layer and KV head: the kept positions in ascending order and the values stored for them, read back by
    matching each kept key to the full cache's (merge keeps keys as they are)."""
    full = prefill(model, get_method("full"), Budget.parse("100000"), ids, len(ids), "question_in_window").cache
    state = prefill(model, method, Budget.parse(budget), ids, len(ids), "question_in_window")
    out = []
    for compressed, reference in zip(state.cache.layers, full.layers):
        heads = []
        for head in range(reference.keys.shape[1]):
            positions = torch.cdist(compressed.keys[0, head], reference.keys[0, head]).argmin(-1)
            order = positions.argsort()
            heads.append((positions[order].tolist(), compressed.values[0, head][order]))
        out.append(heads)
    return out


MERGE = [
    (("merge", {"base": "knorm"}), ("kvpress:MergingPress", {"press": "KnormPress"})),
    (("merge", {"base": "snapkv", "window": 8, "kernel": 5, "similarity_threshold": 0.2}),
     ("kvpress:MergingPress", {"press": "SnapKVPress", "press.window_size": 8, "press.kernel_size": 5,
                               "similarity_threshold": 0.2})),
    (("merge", {"base": "tova", "merge_fraction": 0.75}), ("kvpress:MergingPress", {"press": "TOVAPress",
                                                                                    "merge_fraction": 0.75})),
]


@pytest.mark.parametrize("native, press", MERGE, ids=[f"{n[1]['base']}-{len(n[1])}" for n, _ in MERGE])
@pytest.mark.parametrize("budget", ["r0.5", "40"])
def test_merge_keeps_and_merges_what_mergingpress_does(model, native, press, budget):
    ids = prompt(model.config.vocab_size)
    ours = kept_rows(model, get_method(native[0], **native[1]), budget, ids)
    theirs = kept_rows(model, get_method(press[0], **press[1]), budget, ids)
    plain = kept_rows(model, get_method(native[1]["base"], **{k: v for k, v in native[1].items()
                                                                 if k in ("window", "kernel")}), budget, ids)
    changed = 0
    for our_layer, their_layer, plain_layer in zip(ours, theirs, plain):
        for (positions, values), (their_positions, their_values), (plain_positions, plain_values) in zip(
                our_layer, their_layer, plain_layer):
            assert positions == their_positions == plain_positions  # the base's selection, kept as it is
            torch.testing.assert_close(values, their_values, rtol=1e-6, atol=1e-9)
            changed += int(not torch.equal(values, plain_values))
    assert changed  # values were merged, not only kept


def lazy_shares(model, ids, budget: int, sinks: int = 4, last: int = 1) -> list[float]:
    """Per layer, the attention share SimLayerKVPress compares with its threshold, from an eager forward."""
    implementation = model.config._attn_implementation
    model.set_attn_implementation("eager")  # the attention weights
    try:
        with torch.no_grad():
            attentions = model(torch.tensor([ids]), output_attentions=True).attentions
    finally:
        model.set_attn_implementation(implementation)
    recent = budget - sinks + last
    shares = []
    for layer in attentions:
        share = layer[0, :, -last:, : len(ids) - last].mean(dim=(0, 1))
        shares.append(float(share[:sinks].sum() + share[-recent:].sum()))
    return shares


def simlayerkv_press_kept(model, ids, threshold: float, budget: int) -> list[list[set[int]]]:
    """What SimLayerKVPress keeps per layer and KV head (its compression ratio cannot be set: no adapter)."""
    from kvmethods.adapters.transformers_compat import DynamicCache, cache_argument

    full = prefill(model, get_method("full"), Budget.parse("100000"), ids, len(ids), "question_in_window").cache
    press = kvpress.SimLayerKVPress(lazy_threshold=threshold, n_last=1, n_recent=budget - 4 + 1, n_initial=4)
    cache = DynamicCache()
    with torch.no_grad(), press(model):
        model(input_ids=torch.tensor([ids]), **cache_argument(model, cache))
    return [[set(torch.cdist(compressed.keys[0, head], reference.keys[0, head]).argmin(-1).tolist())
             for head in range(reference.keys.shape[1])] for compressed, reference in zip(cache.layers, full.layers)]


@pytest.mark.parametrize("budget", [40, 20])
def test_simlayerkv_keeps_what_simlayerkvpress_keeps(model, budget):
    ids = prompt(model.config.vocab_size)
    shares = sorted(lazy_shares(model, ids, budget))
    middle = len(shares) // 2
    threshold = (shares[middle - 1] + shares[middle]) / 2  # half the layers lazy, far from the boundary
    state = prefill(model, get_method("simlayerkv", threshold=threshold), Budget.parse(str(budget)), ids, len(ids),
                    "question_in_window")
    heads = model.config.num_key_value_heads
    ours = [[set(range(len(ids)))] * heads if kept is None else [set(head.tolist()) for head in kept[0]]
            for kept in state.kept_indices]
    assert ours == simlayerkv_press_kept(model, ids, threshold, budget)
    lengths = sorted(len(layer[0]) for layer in ours)
    assert lengths == [budget] * middle + [len(ids)] * (len(lengths) - middle)


@pytest.mark.parametrize("params, press_params", [({}, {}), ({"tau": 2.0, "n_sink": 2}, {"tau": 2.0, "n_sink": 2})])
@pytest.mark.parametrize("budget", ["r0.5", "40"])
def test_capkv_keeps_what_cappress_keeps(model, params, press_params, budget):
    ids = prompt(model.config.vocab_size)
    ours = native_kept(model, get_method("capkv", **params), budget, ids)
    theirs = press_kept(model, get_method("kvpress:CapPress", **press_params), budget, ids)
    assert ours == theirs


def test_a_press_that_decides_its_own_ratio_is_one_line_through_the_adapter():
    from kvmethods import MethodError

    with pytest.raises(MethodError) as refused:
        get_method("kvpress:SimLayerKVPress")
    message = str(refused.value)
    assert "SimLayerKVPress decides its compression itself" in message and "\n" not in message
