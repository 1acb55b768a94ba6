"""Tiny random-weight models (float32, 2 layers, hidden 64, vocabulary 128) of every decoder family the
project describes, built from transformers' own config classes: the family tests (tests/kvmethods/
test_families.py) and the family table (scripts/family_table.py) use them. Every family here exists in
transformers 5.2 and 5.24 (both ends of the supported range).
"""

from __future__ import annotations

import torch
from transformers import CONFIG_MAPPING, AutoModelForCausalLM

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
    "deepseek_v3": dict(kv_lora_rank=16, q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
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


def family_model(family: str, *, seed: int = 0, **overrides):
    """The family's tiny model in eval mode, with the attention implementation transformers picks for it."""
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(family_config(family, **overrides), dtype=torch.float32).eval()
