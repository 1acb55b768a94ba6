#!/usr/bin/env python
"""Every method's decode speed from one shared prefill, for copies of the code interleaved (issue 36, item 4).

A slow decode path shows as a method decoding slower than the others from caches of the same budget, so
the methods' compressed caches are made once (one shared prefill of a RULER prompt, saved with torch.save
to `--state`, so that a long prompt on a big model is prefilled once for all rounds) and each round
decodes every method's copy for `--tokens` tokens in a fresh process per copy of the code (`--code DIR`,
repeatable: e.g. this checkout and `git archive main` unpacked), round after round, so the neighbours'
load falls on all alike. Printed: per method and code, the median wall and CPU (process) seconds per token
and tokens/s (of CPU time on a CPU, of wall time on CUDA, where `--device cuda` runs it and the clock
waits for the queued work), each code's new/old ratio, and the load average. The saved state also records each method's
own selection seconds of that prefill (`own_s`: where H2O's accumulated attention shows).

    python scripts/measure/random_model.py qwen2.5-0.5b /tmp/qwen05
    python scripts/measure/measure_method_decode.py --model /tmp/qwen05 --context-length 8192 --state /tmp/state-8k.pt \\
        --methods streamingllm,snapkv,pyramidkv,h2o,tova,adakv --tokens 16 --rounds 3 --code /tmp/old --code .
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import require_positive

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder (config.json + weights + tokenizer)")
    parser.add_argument("--methods", default="streamingllm,snapkv,pyramidkv,h2o,tova,adakv")
    parser.add_argument("--budget", default="1024")
    parser.add_argument("--task", default="niah_single_1", help="a RULER task whose first prompt is prefilled")
    parser.add_argument("--context-length", type=int, default=8192)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--tokens", type=int, default=16, help="tokens each method decodes per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians are printed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", help="cpu or cuda (on CUDA, read the wall times: CPU time waits)")
    parser.add_argument("--state", type=Path, required=True, help="the prefilled caches: made here if missing")
    parser.add_argument("--code", type=Path, action="append", help="a copy of the code (repeatable; default .)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    require_positive(parser, args, ("context_length", "tokens", "rounds", "threads"))
    return args


def load_model(args):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    return AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype),
                                                attn_implementation="sdpa").to(args.device).eval()


def make_state(args) -> None:
    """One shared prefill of the task's first prompt for every method; its states saved to args.state."""
    import torch
    from transformers import AutoTokenizer

    from kvmethods import get_method
    from kvmethods.core.budget import Budget
    from kvmethods.runtime.shared_prefill import shared_prefill
    from pytest_kvbench.tasks import get_task

    model, tokenizer = load_model(args), AutoTokenizer.from_pretrained(args.model)
    task = get_task(args.task)
    sample = task.load_samples(tokenizer, n=1, seed=0, data_dir=None, context_length=args.context_length)[0]
    ids = task.build_prompt(sample, tokenizer, args.context_length - task.max_new_tokens).input_ids
    methods = args.methods.split(",")
    started = time.perf_counter()
    shared = shared_prefill(model, [(get_method(name), Budget.parse(args.budget)) for name in methods], ids,
                            len(ids), "question_in_window")
    print(f"shared prefill of {len(ids)} tokens: {time.perf_counter() - started:.1f} s wall, forward "
          f"{shared.forward_s:.1f} s; own selection seconds: "
          + ", ".join(f"{name} {own:.2f}" for name, own in zip(methods, shared.own_s)), flush=True)
    torch.save({"methods": methods, "states": shared.selections + [shared.reference], "own_s": shared.own_s,
                "forward_s": shared.forward_s, "prompt_tokens": len(ids)}, args.state)


def child(args) -> None:
    """Decode every saved state with the code on PYTHONPATH; one JSON line of {method: [wall, cpu]}."""
    import torch

    from kvmethods.core.clock import now
    from kvmethods.runtime.generation import PrefilledPrompt, decode_greedy

    model = load_model(args)
    saved = torch.load(args.state, weights_only=False, map_location=args.device)
    out = {}
    for name, state in zip([*saved["methods"], "full"], saved["states"]):
        if state is None:  # the method raised in the shared prefill
            continue
        fork = PrefilledPrompt(copy.deepcopy(state.cache), state.next_logits, state.next_position, state.uneven)
        wall, cpu = now(), time.process_time()  # now(): after the queued CUDA work
        with torch.inference_mode():
            tokens, _, _, _ = decode_greedy(model, fork, args.tokens, set())
        out[name] = [now() - wall, time.process_time() - cpu, len(tokens)]
    print(json.dumps(out))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        return child(args)
    if not args.state.exists():
        sys.path.insert(0, str(ROOT))  # this checkout's packages make the state; each child imports its --code
        make_state(args)
    codes = [code.resolve() for code in args.code or [ROOT]]
    runs: dict[str, list[dict]] = {str(code): [] for code in codes}
    loads = []
    for _ in range(args.rounds):
        for code in codes:
            loads.append(os.getloadavg()[0])
            command = [sys.executable, __file__, "--child", *sys.argv[1:]] if argv is None else \
                [sys.executable, __file__, "--child", *argv]
            done = subprocess.run(command, env=dict(os.environ, PYTHONPATH=str(code)), capture_output=True,
                                  text=True, check=True)
            runs[str(code)].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"{args.model} ({args.dtype}, {args.device}), budget {args.budget}, {args.task}@{args.context_length}, {args.tokens} "
          f"tokens decoded per method, {args.threads} thread(s), {args.rounds} interleaved rounds, load average "
          f"{statistics.median(loads):.1f} (min {min(loads):.1f}, max {max(loads):.1f})")
    medians: dict[str, dict[str, tuple[float, float]]] = {}
    for code, rounds in runs.items():
        medians[code] = {name: tuple(statistics.median(r[name][i] / args.tokens for r in rounds) for i in (0, 1))
                         for name in rounds[0]}
    names = list(next(iter(medians.values())))
    header = "method".ljust(14) + "".join(f"{Path(code).name[:18]:>38s}" for code in medians)
    print(header + ("   new/old CPU s per token" if len(codes) == 2 else ""))
    for name in names:
        row = name.ljust(14)
        for code in medians:
            wall, cpu = medians[code][name]
            rate = 1 / (wall if args.device != "cpu" else cpu)
            row += f"   {wall:6.3f} s wall {cpu:6.3f} s CPU ({rate:6.1f} tok/s)"
        if len(codes) == 2:
            old, new = (medians[str(code)][name][1] for code in codes)
            row += f"   {new / old:5.2f}x"
        print(row)


if __name__ == "__main__":
    main()
