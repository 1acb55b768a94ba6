"""The model families the compressing methods are verified on (attention/families.py checks a loaded model).

A name list without torch, so that pytest-kvbench can refuse a GGUF model of another family at startup, before
any weights load, instead of failing every compressing item with MethodError.
"""

# Verified by tests/kvmethods/test_families.py on tiny models of each (attention/model_probe.py describes them by
# probing, not by these names; a family outside the list with a known layout still compresses once loaded).
SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "phi3", "gemma2", "gemma3", "gemma3_text",
                      "gpt_oss", "olmo2", "granite", "smollm3", "glm4", "cohere2", "deepseek_v3", "qwen3_next")
