"""Tiny, randomly initialised decoder models built in-process from configs (no hub access).

Shared by the tests, the kernel benchmarks (bench/test_kernels.py) and the measurement scripts
(scripts/measure/) so that all of them exercise the same four families with grouped-query attention; a
third-party method's own tests can build the same models. Imports torch and transformers: nothing of the
package imports it.
"""

from __future__ import annotations

import gc

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

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
