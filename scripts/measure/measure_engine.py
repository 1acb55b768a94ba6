"""The llama.cpp engine rows' figures in docs/performance.md: the backend's overhead, and the engine's speed beside
transformers' full cache.

    python scripts/measure/measure_engine.py overhead [--model smollm2-135m] [--tokens 512] [--new 32] [--repeats 5]
    python scripts/measure/measure_engine.py speed [--model smollm2-135m,gemma3-270m|FILE.gguf] [--contexts 2048,8192]
                                                   [--new 32] [--repeats 2] [--caches f16,q8_0,q4_0]

overhead: the same prompt's completion through the benchmark's backend (serving/llamacpp/backend.py: the server in a
child process, JSON lines over pipes) and through a bare xllamacpp Server in this process, interleaved, same
settings (f16 cache, flash attention, one thread): the backend's wall time over the bare call's, and over the
server call's own time inside the engine process (what the pipes and JSON add, free of the two engines' noise).

speed: time to first token and per output token of transformers' full cache (kvmethods' generate: prefill, then
greedy steps) and of llama.cpp's cache types (its own timings), on the same random prompt of each context length
(the prompt is the context less the --new tokens, so that both fill the context as a RULER length counts it:
SmolLM2's 8,192 is also llama.cpp's cap), interleaved per repeat so both see the same load (several models,
comma-separated, in the same run; the order of the rows of one model and context rotates each repeat; the load
average is sampled after every measurement and progress goes to stderr). transformers runs the GGUF's float
conversion, llama.cpp the GGUF's quantized weights.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from common import prompt_ids  # also puts this checkout first on sys.path

from pytest_kvbench.model_sources.reference import gguf_file_of
from pytest_kvbench.serving.backend import EngineSettings
from pytest_kvbench.serving.llamacpp import engine_process
from pytest_kvbench.serving.llamacpp.backend import LlamaCppBackend, completion_request


def _model_file(model: str) -> str:
    found = gguf_file_of(model)
    if found is None:
        raise SystemExit(f"{model}: no GGUF file")
    return str(found)


def _median(values: list[float]) -> float:
    return statistics.median(values)


def overhead(args) -> dict:
    import xllamacpp  # lazy: the [llamacpp] extra, this command only

    settings = EngineSettings(_model_file(args.model), "f16", "f16", args.tokens + args.new + 64, 1)
    ids = prompt_ids(args.tokens)
    request = completion_request(ids, args.new, 10)
    bare = xllamacpp.Server(engine_process._params(xllamacpp, settings.__dict__))
    backend = LlamaCppBackend(settings)
    backend.start()
    walls: dict[str, list[float]] = {"backend": [], "engine_call": [], "bare": []}
    try:
        for repeat in range(args.repeats):
            for which in ("backend", "bare") if repeat % 2 == 0 else ("bare", "backend"):  # neither always first
                if which == "backend":
                    done = backend.complete(ids, args.new, [], 10)
                    walls["backend"].append(done.wall_s)
                    walls["engine_call"].append(done.engine["call_s"])
                else:
                    started = time.perf_counter()
                    bare.handle_completions(dict(request))
                    walls["bare"].append(time.perf_counter() - started)
    finally:
        backend.close()
    medians = {name: _median(values) for name, values in walls.items()}
    return {"what": "overhead", "model": args.model, "tokens": args.tokens, "new": args.new, "repeats": args.repeats,
            "load": os.getloadavg()[0], **{f"{name}_s": value for name, value in medians.items()},
            "over_bare_pct": 100 * (medians["backend"] - medians["bare"]) / medians["bare"],
            "over_engine_call_pct": 100 * (medians["backend"] - medians["engine_call"]) / medians["backend"],
            "walls": walls}


def _transformers(loaded, ids: list[int], new: int) -> tuple[float, float]:
    from kvmethods import FULL_CACHE, get_method  # lazy: torch, the speed command only
    from kvmethods.runtime.generation import generate

    out = generate(loaded.model, get_method(FULL_CACHE.spec), FULL_CACHE, ids, len(ids), new, set(),
                   "question_in_window")
    steps = max(len(out.tokens) - 1, 1)  # the first token comes with the prefill
    return out.prefill_s * 1000, out.decode_s * 1000 / steps


def _load() -> float:
    return os.getloadavg()[0]


def speed(args) -> dict:
    """Every (model, context) measured once per repeat, the rows of one (model, context) back to back in an order
    that rotates each repeat (transformers first, then an engine first, ...), so no row always runs first or last."""
    from pytest_kvbench.engine.models import ModelCache  # lazy: torch, the speed command only

    models = args.model.split(",")
    caches = args.caches.split(",")
    contexts = [int(c) for c in args.contexts.split(",")]
    cache = ModelCache()
    engines = {(model, kind): LlamaCppBackend(EngineSettings(_model_file(model), kind, kind,
                                                             max(contexts) + args.new + 64, 1))
               for model in models for kind in caches}
    for engine in engines.values():
        engine.start()
    rows: dict[tuple, list[tuple[float, float]]] = {}
    loads = [_load()]
    started = time.perf_counter()
    try:
        for repeat in range(args.repeats):
            for model in models:
                loaded, _ = cache.get(model, "auto", "sdpa")
                for context in contexts:
                    ids = prompt_ids(context - args.new)  # prompt and answer fill the context, as RULER counts it
                    names = ["transformers full", *(f"llamacpp:{kind}" for kind in caches)]
                    shift = repeat % len(names)
                    for name in names[shift:] + names[:shift]:
                        if name == "transformers full":
                            value = _transformers(loaded, ids, args.new)
                        else:
                            done = engines[(model, name.split(":", 1)[1])].complete(ids, args.new, [], 10)
                            value = (done.ttft_ms, done.tpot_ms or 0.0)
                        rows.setdefault((model, name, context), []).append(value)
                        loads.append(_load())
                        print(f"[{time.perf_counter() - started:7.0f} s] repeat {repeat} {model} {context} {name}: "
                              f"TTFT {value[0]:.0f} ms, TPOT {value[1]:.1f} ms, load {loads[-1]:.1f}",
                              file=sys.stderr, flush=True)
    finally:
        for engine in engines.values():
            engine.close()
    table = []
    for (model, name, context), values in rows.items():
        full = rows[(model, "transformers full", context)]
        ttft, tpot = _median([v[0] for v in values]), _median([v[1] for v in values])
        table.append({"model": model, "row": name, "context": context, "ttft_ms": ttft, "tpot_ms": tpot,
                      "ttft_vs_full": ttft / _median([v[0] for v in full]),
                      "tpot_vs_full": tpot / _median([v[1] for v in full]), "values": values})
    return {"what": "speed", "models": models, "new": args.new, "repeats": args.repeats,
            "load_min": min(loads), "load_median": _median(loads), "load_max": max(loads),
            "wall_s": time.perf_counter() - started, "rows": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("overhead", "speed"))
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--contexts", default="2048")
    parser.add_argument("--caches", default="f16,q8_0,q4_0")
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    result = overhead(args) if args.what == "overhead" else speed(args)
    print(json.dumps(result, indent=1))
    if args.what == "speed":
        print("| model | row | context | TTFT ms | TPOT ms | TTFT / full | TPOT / full |")
        print("|---|---|---|---|---|---|---|")
        for row in result["rows"]:
            print(f"| {row['model']} | {row['row']} | {row['context']} | {row['ttft_ms']:.0f} | {row['tpot_ms']:.1f} | "
                  f"{row['ttft_vs_full']:.2f} | {row['tpot_vs_full']:.2f} |")


if __name__ == "__main__":
    main()
