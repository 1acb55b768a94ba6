"""The model families the compressing methods are verified on (families.py checks a loaded model against it).

A name list without torch, so that pytest-kvbench can refuse a GGUF model of another family at startup, before
any weights load, instead of failing every compressing item with MethodError.
"""

SUPPORTED_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
