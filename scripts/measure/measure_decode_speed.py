#!/usr/bin/env python
"""Decode speed of the harness's greedy loop against transformers' `generate` on the same compressed cache.

A user weighs the harness's decode tokens/s (the records' `latency.decode_tokens_per_s`) against what
`model.generate` does with the same cache, so both decode the same number of tokens from copies of one
prefilled cache (a RULER prompt compressed by the method at the budget): the harness through
`kvmethods.runtime.generation.decode_greedy` (explicit original RoPE positions, per-layer masks when layers are uneven),
transformers through `generate(past_key_values=..., do_sample=False, min_new_tokens=N, max_new_tokens=N)`,
which positions new tokens after the cache's length (same arithmetic, other RoPE angles). The two alternate
for `--repeat` rounds; medians of wall and CPU (process) time per token are printed with the load average.

    python scripts/measure/measure_decode_speed.py --model /path/to/model --method snapkv --budget 256 --tokens 64
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder (config.json + weights + tokenizer)")
    parser.add_argument("--method", default="snapkv")
    parser.add_argument("--budget", default="256")
    parser.add_argument("--task", default="niah_single_1", help="a RULER task whose first prompt is prefilled")
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--tokens", type=int, default=64, help="tokens each side decodes")
    parser.add_argument("--repeat", type=int, default=5, help="interleaved rounds; medians are printed")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    for name in ("context_length", "tokens", "repeat", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer")
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
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kvmethods import get_method
    from kvmethods.runtime.generation import PrefilledPrompt, decode_greedy, prefill

    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    ids = prompt_ids(tokenizer, args.task, args.context_length)
    method = get_method(args.method)
    state = prefill(model, method, args.budget, ids, len(ids), "question_in_window", len(ids) + args.tokens)
    if state.uneven:
        sys.exit(f"{args.method} leaves layers of different lengths, which generate() cannot decode; pick another")
    first = int(state.next_logits.argmax())
    cached = state.cache.get_seq_length()

    def harness() -> None:
        fork = PrefilledPrompt(copy.deepcopy(state.cache), state.next_logits, state.next_position, state.uneven)
        with torch.inference_mode():
            tokens, _, _, _ = decode_greedy(model, fork, args.tokens, set(), method=method)
        assert len(tokens) == args.tokens

    def transformers_generate() -> None:
        cache = copy.deepcopy(state.cache)
        # generate() feeds the tokens after the cache's length: the cache's stand-ins, then the first answer token
        # (the harness starts from the prefill's logits, so it too runs tokens - 1 forwards after the first)
        inputs = torch.tensor([[0] * cached + [first]])
        with torch.inference_mode():
            out = model.generate(inputs, attention_mask=torch.ones_like(inputs), past_key_values=cache,
                                 do_sample=False, min_new_tokens=args.tokens - 1, max_new_tokens=args.tokens - 1,
                                 pad_token_id=tokenizer.eos_token_id)
        assert out.shape[1] - inputs.shape[1] == args.tokens - 1

    times: dict[str, list[tuple[float, float]]] = {"harness decode_greedy": [], "transformers generate": []}
    loads = []
    for _ in range(args.repeat):
        loads.append(os.getloadavg()[0])
        times["harness decode_greedy"].append(timed(harness))
        times["transformers generate"].append(timed(transformers_generate))
    print(f"{args.model}: {args.method} at {args.budget} on {args.task}@{args.context_length} ({len(ids)} prompt "
          f"tokens, {cached} cached), {args.tokens} tokens decoded, {args.threads} thread(s), {args.repeat} rounds, "
          f"load average {statistics.median(loads):.1f}")
    rates = {}
    for name, runs in times.items():
        wall, cpu = (statistics.median(run[i] for run in runs) for i in (0, 1))
        rates[name] = (args.tokens / wall, args.tokens / cpu)
        print(f"{name:24s} median wall {wall:6.2f} s ({rates[name][0]:6.1f} tokens/s), "
              f"CPU {cpu:6.2f} s ({rates[name][1]:6.1f} tokens/s per CPU s)")
    ours, theirs = rates["harness decode_greedy"], rates["transformers generate"]
    print(f"harness / generate tokens per second: wall {ours[0] / theirs[0]:.2f}x, CPU {ours[1] / theirs[1]:.2f}x")


if __name__ == "__main__":
    main()
