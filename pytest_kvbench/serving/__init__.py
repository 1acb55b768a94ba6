"""Serving engines beside the research methods: an engine's own KV-cache types run on the same prompts.

A grid method named ``llamacpp:q8_0`` is not built by kvmethods: its items run here, in a serving engine that
takes the prompt's token ids, decodes greedily and reports its own timings (time to first token, time per output
token). backend.py is the interface an engine implements (llama.cpp's in llamacpp/, vLLM's sketched in
docs/gpus.md); engine_pool.py keeps one engine per worker and cache types; engine_item.py makes an item's record,
scored by the task's own scorer and compared with the engine's f16 cache and transformers' full cache.
This room sits between engine/ (the prompts, the full-cache reference) and wiring/ (which dispatches an item here).
"""
