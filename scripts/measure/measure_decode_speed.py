#!/usr/bin/env python
"""Decode speed of the harness's greedy loop against transformers' `generate`: on the same cache, and plain.

A user weighs the harness's decode tokens/s (the records' `latency.decode_tokens_per_s`) against what
`model.generate` does. Three sides decode the same number of tokens after one prompt (a RULER prompt compressed by
the method at the budget; `--method full`: the full cache, the reference every item decodes), alternating for
`--repeat` rounds, the prefills not timed:

- harness: `kvmethods.runtime.generation.generate(..., prefilled=copy)` on a copy of the prefilled cache, the
  runner's road (explicit original RoPE positions, per-layer masks when layers are uneven, an uncompressed cache's
  sliding layers cut to their window: runtime/sliding_decode.py);
- generate, same cache: `generate(past_key_values=copy, do_sample=False, min_new_tokens=N, max_new_tokens=N)`,
  which positions new tokens after the cache's length (same arithmetic, other RoPE angles);
- plain generate (`--method full` only): the anchor, transformers alone. The prompt is prefilled into the cache
  `generate` makes itself (DynamicCache(config=...): sliding layers hold their window), then `generate` decodes.

Medians of wall and CPU (process) time per token are printed with the load average, and each side's ratio to the
harness (median of the per-round ratios).

    python scripts/measure/measure_decode_speed.py --model /path/to/model --method snapkv --budget 256 --tokens 64
    python scripts/measure/measure_decode_speed.py --model /work/models/gemma-3-270m-q4_k_m.gguf --method full \
        --context-length 8192 --tokens 32 --repeat 3
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from common import require_positive  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder, a named model or a .gguf file (converted)")
    parser.add_argument("--dtype", default="auto", help="the harness's --kvbench-dtype (auto: float32 on CPU)")
    parser.add_argument("--method", default="snapkv")
    parser.add_argument("--budget", default="256")
    parser.add_argument("--task", default="niah_single_1", help="a RULER task whose first prompt is prefilled")
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=64, help="tokens each side decodes")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds; medians are printed")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    require_positive(parser, args, ("context_length", "tokens", "repeat", "threads"))
    return args


def prompt_ids(tokenizer, task_name: str, context_length: int) -> list[int]:
    from pytest_kvbench.tasks import get_task

    task = get_task(task_name)
    sample = task.load_samples(tokenizer, n=1, seed=0, data_dir=None, context_length=context_length)[0]
    return task.build_prompt(sample, tokenizer, context_length - task.max_new_tokens).input_ids


def timed(run) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # lazy for startup time: torch and transformers load after the arguments are checked
    import torch

    from kvmethods import get_method
    from kvmethods.adapters.transformers_compat import DynamicCache
    from kvmethods.runtime.generation import PrefilledPrompt, generate, prefill
    from pytest_kvbench.engine.models import ModelCache

    torch.set_num_threads(args.threads)
    loaded, _ = ModelCache().get(args.model, args.dtype)
    model, tokenizer = loaded.model, loaded.tokenizer
    ids = prompt_ids(tokenizer, args.task, args.context_length)
    method = get_method(args.method)
    with torch.inference_mode():
        state = prefill(model, method, args.budget, ids, len(ids), "question_in_window", len(ids) + args.tokens)
    if state.uneven:
        sys.exit(f"{args.method} leaves layers of different lengths, which generate() cannot decode; pick another")
    first = int(state.next_logits.argmax())
    cached = state.cache.get_seq_length()
    plain_cache = None
    if args.method == "full":  # the cache generate() makes itself, the prompt in it
        plain_cache = DynamicCache(config=model.config)
        with torch.inference_mode():
            model(input_ids=torch.tensor([ids]), past_key_values=plain_cache, use_cache=True, logits_to_keep=1)

    def harness() -> None:
        fork = PrefilledPrompt(copy.deepcopy(state.cache), state.next_logits, state.next_position, state.uneven)
        out = generate(model, method, None, ids, len(ids), args.tokens, set(), "question_in_window", prefilled=fork)
        assert len(out.tokens) == args.tokens

    def generate_on(cache, stand_ins: int) -> None:
        # generate() feeds the tokens after the cache's length: the cache's stand-ins, then the first answer token
        # (the harness starts from the prefill's logits, so it too runs tokens - 1 forwards after the first)
        inputs = torch.tensor([[0] * stand_ins + [first]])
        with torch.inference_mode():
            out = model.generate(inputs, attention_mask=torch.ones_like(inputs), past_key_values=cache,
                                 do_sample=False, min_new_tokens=args.tokens - 1, max_new_tokens=args.tokens - 1,
                                 pad_token_id=tokenizer.eos_token_id)
        assert out.shape[1] - inputs.shape[1] == args.tokens - 1

    sides = {"harness generate(prefilled)": harness,
             "transformers generate, same cache": lambda: generate_on(copy.deepcopy(state.cache), cached)}
    if plain_cache is not None:
        sides["plain transformers generate"] = lambda: generate_on(copy.deepcopy(plain_cache), len(ids))
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    loads = []
    for _ in range(args.repeat):
        loads.append(os.getloadavg()[0])
        for name, side in sides.items():
            times[name].append(timed(side))
    print(f"{args.model}: {args.method} at {args.budget} on {args.task}@{args.context_length} ({len(ids)} prompt "
          f"tokens, {cached} cached), {args.tokens} tokens decoded, {loaded.dtype}, {args.threads} thread(s), "
          f"{args.repeat} rounds, load average {statistics.median(loads):.1f}")
    ours = times["harness generate(prefilled)"]
    for name, runs in times.items():
        wall, cpu = (statistics.median(run[i] for run in runs) for i in (0, 1))
        ratio = statistics.median(a[1] / b[1] for a, b in zip(ours, runs))
        print(f"{name:34s} median wall {wall:6.2f} s ({1000 * wall / args.tokens:6.1f} ms/token), "
              f"CPU {cpu:6.2f} s ({1000 * cpu / args.tokens:6.1f} ms/token); harness CPU / this {ratio:.2f}x")

if __name__ == "__main__":
    main()
