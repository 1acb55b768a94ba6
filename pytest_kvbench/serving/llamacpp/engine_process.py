"""The llama.cpp engine's own process: ``python -m pytest_kvbench.serving.llamacpp.engine_process SETTINGS``.

llama.cpp runs in a child process, not in the pytest worker: a crash in native code (or a kill) ends the engine
alone, which the backend reports as that item's error, and the log llama.cpp writes to its stderr (the cache it
allocated: llama_kv_cache lines) lands in a file the backend reads. Requests come as JSON lines on stdin (a
completion request; an empty line ends the process); each answer is one JSON line on the original stdout, while
anything the library prints goes to the log.
"""

from __future__ import annotations

import json
import os
import sys
import time

# ggml's cache type names -> xllamacpp's enum member names
_TYPE_MEMBER = "GGML_TYPE_{}"


def _params(xllamacpp, settings: dict):
    params = xllamacpp.CommonParams()
    params.model.path = settings["model_file"]
    params.n_ctx = settings["context_tokens"]
    params.n_parallel = 1
    params.n_batch = params.n_ubatch = settings.get("batch", 512)
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = settings["threads"]
    params.cache_type_k = getattr(xllamacpp.ggml_type, _TYPE_MEMBER.format(settings["cache_type_k"].upper()))
    params.cache_type_v = getattr(xllamacpp.ggml_type, _TYPE_MEMBER.format(settings["cache_type_v"].upper()))
    # flash attention for every cache type: a quantized value cache needs it, and f16 (the engine's reference)
    # then differs from the others by its cache type alone
    params.flash_attn_type = xllamacpp.llama_flash_attn_type.LLAMA_FLASH_ATTN_TYPE_ENABLED
    params.warmup = False
    params.verbosity = 4  # llama.cpp prints the model's geometry and the KV cache it allocated (kv_report.py)
    return params


def main(argv: list[str]) -> int:
    settings = json.loads(argv[0])
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the library's prints join its log (stderr, a file the backend reads)
    import xllamacpp  # lazy: the [llamacpp] extra, imported in the engine's own process only

    server = xllamacpp.Server(_params(xllamacpp, settings))
    answers.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            break
        started = time.perf_counter()
        response = server.handle_completions(json.loads(line))
        if isinstance(response, str):
            response = json.loads(response)
        answers.write(json.dumps({"response": response, "wall_s": time.perf_counter() - started}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
