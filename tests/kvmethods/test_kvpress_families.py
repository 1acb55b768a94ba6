"""Native methods keep what kvpress's presses keep on the families kvpress supports beyond llama/mistral/qwen2/
qwen3: phi3 (fused qkv_proj: queries captured from the attention call) and gemma3 (sliding and global layers;
kvpress leaves the sliding ones alone, kvmethods keeps them as their window, so only global layers compare),
and qwen3 from kvmethods/testing.py's family models. Skipped unless kvpress is installed (CI's second env)."""

import pytest
import torch

kvpress = pytest.importorskip("kvpress")

from kvmethods import MethodError, get_method  # noqa: E402
from kvmethods.core.layout import GLOBAL  # noqa: E402
from kvmethods.attention.model_probe import describe  # noqa: E402
from kvmethods.testing import family_model  # noqa: E402
from test_kvpress_adapter import distinct_prompt, native_kept, press_kept, prompt  # noqa: E402
from model_helpers import one_thread  # noqa: E402, F401 (one_thread applies here)

SETTINGS = [
    (("snapkv", {"window": 8, "kernel": 5}), ("kvpress:SnapKVPress", {"window_size": 8, "kernel_size": 5})),
    (("tova", {}), ("kvpress:TOVAPress", {})),
    (("knorm", {}), ("kvpress:KnormPress", {})),
    (("streamingllm", {"sinks": 4}), ("kvpress:StreamingLLMPress", {"n_sink": 4})),
    (("keydiff", {}), ("kvpress:KeyDiffPress", {})),
    (("lagkv", {"lag_size": 16}), ("kvpress:LagKVPress", {"lag_size": 16})),
    (("curdkv", {}), ("kvpress:CURPress", {})),
    (("leverage", {}), ("kvpress:LeverageScorePress", {})),
    (("chunkkv", {"base": "knorm", "chunk_length": 8}), ("kvpress:ChunkKVPress", {"press": "KnormPress",
                                                                                   "chunk_length": 8})),
    (("merge", {"base": "knorm"}), ("kvpress:MergingPress", {"press": "KnormPress"})),
]


# kvpress scales window logits by 1/sqrt(head_dim); gemma3 by query_pre_attn_scalar**-0.5 (the model's own,
# which kvmethods reads off the module): equal when the scalar is head_dim, as in the real Gemma 3 1B/4B.
SETTINGS_OF = {"gemma3_text": {"query_pre_attn_scalar": 16}}


@pytest.fixture(scope="module", params=["phi3", "gemma3_text", "qwen3"])
def model(request):
    return family_model(request.param, seed=1, dtype=torch.float64, qk_scale=10.0,
                        **SETTINGS_OF.get(request.param, {}))


@pytest.mark.parametrize("native, press", SETTINGS, ids=[n[0] for n, _ in SETTINGS])
def test_native_methods_keep_what_kvpress_keeps_on_more_families(model, native, press):
    ids = (distinct_prompt if native[0] == "leverage" else prompt)(model.config.vocab_size)
    if native[0] == "leverage" and model.config.model_type == "phi3":  # RoPE undone only where queries recompute
        with pytest.raises(MethodError, match="it undoes RoPE on the cached keys"):
            native_kept(model, get_method(native[0], **native[1]), "40", ids)
        return
    ours = native_kept(model, get_method(native[0], **native[1]), "40", ids)
    torch.manual_seed(0)  # LeverageScorePress draws its sketches from the global generator, layer after layer
    theirs = press_kept(model, get_method(press[0], **press[1]), "40", ids)
    kinds = [layer.kind for layer in describe(model).layers]
    assert GLOBAL in kinds
    assert [kept for kept, kind in zip(ours, kinds) if kind == GLOBAL] == \
           [kept for kept, kind in zip(theirs, kinds) if kind == GLOBAL]
