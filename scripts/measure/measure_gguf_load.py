"""What a GGUF model costs to load: the first time (conversion) and from the cache (checksums + load).

For docs/models.md: the conversion cache must make a second load cost no more than loading the
converted safetensors. Times each phase in this process after the imports (wall and CPU seconds,
since the machine is shared): the header/sha256 read and its index hit, the cache entry's checksum
verification, ``from_pretrained`` of the converted folder, and (``--direct``) transformers' own
GGUF load, which every load would pay without the cache.

    python scripts/measure/measure_gguf_load.py [FILE.gguf | smollm2-135m] [--direct] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, {"wall_s": round(time.perf_counter() - wall, 3), "cpu_s": round(time.process_time() - cpu, 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="smollm2-135m")
    parser.add_argument("--direct", action="store_true", help="also time transformers' GGUF load (dequantizing)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from pytest_kvbench.engine.gguf_conversion import _dequantizing_config, converted_model
    from pytest_kvbench.model_sources import gguf_cache, gguf_index
    from pytest_kvbench.model_sources.reference import model_source

    torch.set_num_threads(args.threads)
    path = model_source(args.model).gguf or Path(args.model)
    out = {"file": str(path), "load_avg_1m": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as empty:
        os.environ[gguf_cache.CACHE_ENV], kept = empty, os.environ.get(gguf_cache.CACHE_ENV)
        _, out["header_and_sha256_uncached"] = timed(lambda: gguf_index.gguf_info(path))
        if kept is None:
            del os.environ[gguf_cache.CACHE_ENV]
        else:
            os.environ[gguf_cache.CACHE_ENV] = kept
    gguf_index.gguf_info(path)
    info, out["header_and_sha256_indexed"] = timed(lambda: gguf_index.gguf_info(path))
    (folder, _, built), out["conversion_or_verified_entry"] = timed(lambda: converted_model(path))
    out["converted_now"] = built
    _, out["verify_entry_checksums"] = timed(lambda: gguf_cache.is_intact(folder, info.sha256))
    _, out["from_pretrained_converted"] = timed(lambda: (AutoTokenizer.from_pretrained(folder),
                                                         AutoModelForCausalLM.from_pretrained(folder)))
    if args.direct:
        where, name = str(path.parent), path.name
        _, out["from_pretrained_gguf_direct"] = timed(lambda: (
            AutoTokenizer.from_pretrained(where, gguf_file=name),
            AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32, **_dequantizing_config())))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
