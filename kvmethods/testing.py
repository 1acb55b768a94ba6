"""Tiny, randomly initialised decoder models built in-process from configs (no hub access).

Shared by the tests, the kernel benchmarks (bench/test_kernels.py) and the measurement scripts
(scripts/measure/) so that all of them exercise the same four families with grouped-query attention, and
one tiny model of every decoder family kvmethods/core/family_table.py lists (family_model, at the end), and
what layer 0's compression hook sees after a forward (first_layer_inputs); a
third-party method's own tests can build the same models. Imports torch and transformers: nothing of the
package imports it.
"""

from __future__ import annotations

import gc

import torch
from transformers import (
    CONFIG_MAPPING,
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from .adapters.transformers_compat import DynamicCache, cache_argument
from .core.layer_inputs import LayerInputs

FAMILY_CONFIGS = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}


def tiny_config(family: str = "llama", **overrides):
    settings = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
    )
    if family == "qwen3":
        settings["head_dim"] = 16
    if family == "mistral":
        settings["sliding_window"] = None
    settings.update(overrides)
    return FAMILY_CONFIGS[family](**settings)


def tiny_model(family: str = "llama", *, seed: int = 0, attn_implementation: str = "sdpa",
               dtype: torch.dtype = torch.float32, qk_scale: float = 1.0, **overrides):
    """A randomly initialised causal LM of the family, in eval mode.

    Random init gives nearly uniform attention, where every ranking is a coin flip decided by rounding;
    qk_scale multiplies the q/k projections so attention is peaked, as in trained models.
    """
    torch.manual_seed(seed)
    config = tiny_config(family, **overrides)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype)
    if qk_scale != 1.0:
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(qk_scale)
                layer.self_attn.k_proj.weight.mul_(qk_scale)
    return model.eval()


# The performance target's model: hidden 256, 4 layers, 8 query / 2 KV heads; MLP width 688 keeps Llama's
# 2.7x intermediate/hidden ratio and the vocabulary is Llama-2's.
BENCH_MODEL = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                   num_key_value_heads=2, vocab_size=32000)


def bench_model():
    return tiny_model("llama", seed=0, **BENCH_MODEL)


def first_layer_inputs(model, input_ids: torch.Tensor, *, num_layers: int | None = None, grad_mode=torch.no_grad,
                       **forward_kwargs) -> LayerInputs:
    """What the compression hook would hand a method for layer 0 after one forward of `input_ids` ([1, T]): the
    attention module's input, RoPE cos/sin and the layer's cached keys and values (the kernel benchmarks and the
    scoring tests start from it). `num_layers`: the LayerInputs' layer count (default: the model's); `grad_mode`:
    the context the forward runs in (torch.inference_mode for a benchmark)."""
    captured = {}
    cache = DynamicCache()  # passed by us and read after the forward: no reliance on the hook's kwarg names

    def capture(module, args, kwargs, output):
        captured["call"] = (module, kwargs["hidden_states"], *kwargs["position_embeddings"])

    handle = model.model.layers[0].self_attn.register_forward_hook(capture, with_kwargs=True)
    try:
        with grad_mode():
            model(input_ids, use_cache=True, **forward_kwargs, **cache_argument(model, cache))
    finally:
        handle.remove()
    module, hidden, cos, sin = captured["call"]
    layer = cache.layers[0]
    layers = model.config.num_hidden_layers if num_layers is None else num_layers
    return LayerInputs(module, 0, layers, hidden, cos, sin, layer.keys, layer.values)


def tensors_reachable(root) -> list[torch.Tensor]:
    """Every tensor reachable from `root` through references (gc.get_referents), classes excluded."""
    seen, stack, found = set(), [root], []
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type):
            continue
        seen.add(id(obj))
        if issubclass(type(obj), torch.Tensor):
            found.append(obj)
        else:
            stack.extend(gc.get_referents(obj))
    return found


def live_tensor_bytes(tensors=None) -> int:
    """Bytes of the distinct storages of `tensors` (default: every live tensor), parameters excluded: what
    memory tests count instead of timing."""
    if tensors is None:
        gc.collect()
        tensors = (obj for obj in gc.get_objects() if issubclass(type(obj), torch.Tensor))
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors
                if not issubclass(type(t), torch.nn.Parameter)}
    return sum(storages.values())


# -- one tiny model per decoder family the project describes (core/family_table.py)----------------
# float32, 2 layers, hidden 64, vocabulary 128, from transformers' own config classes; every family here exists in
# transformers 5.2 and 5.24 (both ends of the supported range). The family tests, the startup check's tests and
# scripts/write_family_table.py (docs/models.md) use them.

WINDOW = 12  # sliding-window size of the tiny hybrid models: shorter than the test prompts

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "phi3", "gemma2", "gemma3_text", "gpt_oss", "olmo2",
            "granite", "smollm3", "glm4", "cohere2", "deepseek_v3", "qwen3_next")

_HYBRID = ["sliding_attention", "full_attention"]
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_SETTINGS = {
    "mistral": dict(sliding_window=None),
    "qwen3": dict(head_dim=16),
    "qwen3_moe": dict(head_dim=16, **_MOE),
    "gemma2": dict(head_dim=16, sliding_window=WINDOW, layer_types=_HYBRID),
    "gemma3_text": dict(head_dim=16, sliding_window=WINDOW, layer_types=_HYBRID),
    "gpt_oss": dict(head_dim=16, sliding_window=WINDOW, layer_types=_HYBRID, num_local_experts=4,
                    num_experts_per_tok=2, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "cohere2": dict(sliding_window=WINDOW, layer_types=_HYBRID),
    "smollm3": dict(no_rope_layers=[1, 0]),
    "glm4": dict(head_dim=16),
    # KV heads = query heads, as DeepSeek-V3's own config (transformers' attention repeats KV heads by their ratio);
    # a latent wider than a head, so that a latent taken for per-head keys fails
    "deepseek_v3": dict(num_key_value_heads=4, kv_lora_rank=24,
                        q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                        n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=1, moe_intermediate_size=32,
                        n_group=1, topk_group=1),
    "qwen3_next": dict(head_dim=16, layer_types=["linear_attention", "full_attention"], linear_num_value_heads=2,
                       linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                       shared_expert_intermediate_size=32, **_MOE),
}


def family_config(family: str, **overrides):
    settings = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=512, bos_token_id=0, eos_token_id=1,
                    pad_token_id=2, tie_word_embeddings=False)
    settings.update(_SETTINGS.get(family, {}))
    settings.update(overrides)
    return CONFIG_MAPPING[family](**settings)


def family_model(family: str, *, seed: int = 0, dtype: torch.dtype = torch.float32, qk_scale: float = 1.0,
                 **overrides):
    """The family's tiny model in eval mode, with the attention implementation transformers picks for it;
    qk_scale multiplies the query and key projections (peaked attention, as tiny_model's)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(family, **overrides), dtype=dtype).eval()
    if qk_scale != 1.0:
        with torch.no_grad():
            for layer in model.model.layers:
                attention = getattr(layer, "self_attn", None)
                if attention is None:
                    continue
                if hasattr(attention, "qkv_proj"):  # fused: the query and key rows come first
                    rows = (model.config.num_attention_heads + model.config.num_key_value_heads) * attention.head_dim
                    attention.qkv_proj.weight[:rows].mul_(qk_scale)
                else:
                    attention.q_proj.weight.mul_(qk_scale)
                    attention.k_proj.weight.mul_(qk_scale)
    return model
