#!/usr/bin/env python
"""The whole model in bfloat16 (`--kvbench-dtype bfloat16`) against float32: decode speed, and how far its answers move.

On a CPU with bfloat16 instructions (wiring/grid/dtype_support.py refuses the dtype elsewhere) the model's products
run in bfloat16. Both dtypes of the model are loaded once; for each of `--samples` RULER prompts the full cache (the
reference every item decodes) decodes `--tokens` greedy tokens on the harness's road (runtime/generation.generate),
float32 then bfloat16 on even samples and the other way on odd ones. Printed: CPU ms per decoded token (medians over
the samples), the prefills' CPU seconds, and, per sample, the bfloat16 model's fidelity to the float32 one as the
harness measures a method's fidelity to the full cache (engine/fidelity.py): bfloat16 teacher-forced on float32's
output, the mean KL(P_float32 || P_bfloat16) and the greedy agreement, and the number of leading tokens the two
greedy decodes share.

    python scripts/measure/measure_bf16.py --model /work/models/gemma-3-270m-q4_k_m.gguf --context-length 2048 \\
        --samples 4 --tokens 32
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from common import require_positive  # noqa: E402

DTYPES = ("float32", "bfloat16")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder, a named model or a .gguf file (converted)")
    parser.add_argument("--task", default="niah_single_1", help="a RULER task whose first prompts are decoded")
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32, help="greedy tokens each side decodes (no early stop)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    require_positive(parser, args, ("context_length", "samples", "tokens", "threads"))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # lazy for startup time: torch and transformers load after the arguments are checked
    import torch

    from kvmethods import FULL_CACHE, get_method
    from kvmethods.runtime.generation import generate, prefill, teacher_force
    from pytest_kvbench.engine.fidelity import compare, make_reference
    from pytest_kvbench.engine.models import ModelCache
    from pytest_kvbench.tasks import get_task
    from pytest_kvbench.wiring.grid.dtype_support import cpu_flags, dtype_problem

    problem = dtype_problem("bfloat16", False, cpu_flags())
    if problem:
        sys.exit(problem)
    torch.set_num_threads(args.threads)
    cache = ModelCache()
    models = {dtype: cache.get(args.model, dtype)[0] for dtype in DTYPES}
    tokenizer = models["float32"].tokenizer
    task = get_task(args.task)
    budget = task.max_new_tokens
    samples = task.load_samples(tokenizer, n=args.samples, seed=0, data_dir=None, context_length=args.context_length)
    full = get_method("full")
    per_token = {dtype: [] for dtype in DTYPES}
    prefill_cpu = {dtype: [] for dtype in DTYPES}
    rows, loads = [], []
    for index, sample in enumerate(samples):
        ids = task.build_prompt(sample, tokenizer, args.context_length - budget).input_ids
        loads.append(os.getloadavg()[0])
        outputs = {}
        for dtype in (DTYPES if index % 2 == 0 else DTYPES[::-1]):
            model = models[dtype].model
            cpu = time.process_time()
            state = prefill(model, full, FULL_CACHE, ids, len(ids), "question_in_window", len(ids) + args.tokens)
            prefill_cpu[dtype].append(time.process_time() - cpu)
            cpu = time.process_time()
            out = generate(model, full, None, ids, len(ids), args.tokens, set(), "question_in_window",
                           return_logprobs=dtype == "float32", prefilled=state)
            per_token[dtype].append(1000 * (time.process_time() - cpu) / max(1, len(out.tokens) - 1))
            outputs[dtype] = out
        reference = make_reference(outputs["float32"], outputs["float32"].tokens, outputs["float32"].logprobs)
        forced = teacher_force(models["bfloat16"].model, full, FULL_CACHE, ids, len(ids), outputs["float32"].tokens,
                               "question_in_window")
        kl, agreement = compare(reference, forced)
        shared = next((i for i, (a, b) in enumerate(zip(outputs["float32"].tokens, outputs["bfloat16"].tokens))
                       if a != b), min(len(outputs["float32"].tokens), len(outputs["bfloat16"].tokens)))
        rows.append((len(ids), kl, agreement, shared))
    print(f"{args.model}: full cache, {args.task}@{args.context_length}, {args.samples} samples, {args.tokens} tokens, "
          f"{args.threads} thread(s), load average {statistics.median(loads):.1f}")
    for dtype in DTYPES:
        print(f"  {dtype:9s} decode CPU {statistics.median(per_token[dtype]):7.1f} ms/token, prefill CPU "
              f"{statistics.median(prefill_cpu[dtype]):6.1f} s  (per sample ms/token: "
              f"{', '.join(f'{v:.1f}' for v in per_token[dtype])})")
    ratio = statistics.median(b / a for a, b in zip(per_token["float32"], per_token["bfloat16"]))
    print(f"  bfloat16 / float32 decode CPU per token: {ratio:.2f}x (median of the samples' ratios)")
    for prompt_tokens, kl, agreement, shared in rows:
        print(f"  sample ({prompt_tokens} prompt tokens): KL(float32 || bfloat16) {kl:.4f}, greedy agreement "
              f"{agreement:.3f}, first {shared} of {args.tokens} greedy tokens equal")


if __name__ == "__main__":
    main()
