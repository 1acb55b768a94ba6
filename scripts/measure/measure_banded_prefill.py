#!/usr/bin/env python
"""The shared prefill of a hybrid model's long prompt with its sliding layers banded against sdpa over the whole mask.

A sample's shared prefill is one forward of the whole prompt whose hooks hand each member its selection
(runtime/shared_prefill.py). Its sliding layers attend over their band of keys (attention/banded_attention.py);
before, transformers' sdpa computed every query-key score under the sliding mask. Both sides run the same code in
one process, alternating round by round at each length; the "whole mask" side is the runtime with prompt_forward's
`banded_attention` replaced by a null context (what the parent commit ran). Each side prefills a RULER prompt of the
given lengths for `--method` at `--budget` (its selection reads the layers' queries: a family whose queries are
captured, as gemma3's, runs under the capture). Printed per length and side: medians of the forward's seconds
(SharedPrefill.forward_s, selections excluded) and of the whole call's CPU seconds, the load average, and how far
the reference's next-token logits and the member's kept tokens moved.

    python scripts/measure/measure_banded_prefill.py --model /work/models/gemma-3-270m-q4_k_m.gguf \\
        --context-lengths 8192,16384 --repeat 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

SIDES = ("whole mask (before)", "banded (after)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder, a named model or a .gguf file (converted)")
    parser.add_argument("--dtype", default="auto", help="the harness's --kvbench-dtype (auto: float32 on CPU)")
    parser.add_argument("--method", default="snapkv", help="the member whose selection the prefill makes")
    parser.add_argument("--budget", default="m0.125")
    parser.add_argument("--task", default="niah_single_1", help="a RULER task whose first prompt is prefilled")
    parser.add_argument("--context-lengths", default="8192,16384")
    parser.add_argument("--repeat", type=int, default=2, help="interleaved rounds; medians are printed")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        args.lengths = [int(part) for part in args.context_lengths.split(",")]
    except ValueError:
        parser.error(f"--context-lengths: integers separated by commas, not {args.context_lengths!r}")
    if min(args.lengths + [args.repeat, args.threads]) < 1:
        parser.error("--context-lengths, --repeat and --threads must be positive integers")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    # lazy for startup time: torch and transformers load after the arguments are checked
    import torch

    import kvmethods.runtime.prompt_forward as prompt_forward
    from kvmethods import get_method
    from kvmethods.runtime.shared_prefill import shared_prefill
    from measure_decode_speed import prompt_ids
    from pytest_kvbench.engine.models import ModelCache

    torch.set_num_threads(args.threads)
    loaded, _ = ModelCache().get(args.model, args.dtype)
    banded = prompt_forward.banded_attention
    method = get_method(args.method)

    def run(ids: list[int], side: str):
        prompt_forward.banded_attention = banded if side == SIDES[1] else (lambda model: contextlib.nullcontext())
        try:
            cpu = time.process_time()
            with torch.inference_mode():
                shared = shared_prefill(loaded.model, [(method, args.budget)], ids, len(ids), "question_in_window")
            return shared, time.process_time() - cpu
        finally:
            prompt_forward.banded_attention = banded

    print(f"{args.model}: shared prefill with {args.method} at {args.budget}, {loaded.dtype}, {args.threads} "
          f"thread(s), {args.repeat} rounds alternated")
    for length in args.lengths:
        ids = prompt_ids(loaded.tokenizer, args.task, length)
        forward_s = {side: [] for side in SIDES}
        cpu_s = {side: [] for side in SIDES}
        loads, outputs = [], {}
        for _ in range(args.repeat):
            loads.append(os.getloadavg()[0])
            for side in SIDES:
                shared, cpu = run(ids, side)
                forward_s[side].append(shared.forward_s)
                cpu_s[side].append(cpu)
                outputs[side] = shared
                del shared
        before, after = (outputs[side] for side in SIDES)
        moved = float((before.reference.next_logits - after.reference.next_logits).abs().max())
        kept = [torch.isin(a, b).float().mean().item() for a, b in zip(before.selections[0].kept_indices,
                                                                        after.selections[0].kept_indices)
                if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype != torch.bool]
        same = bool(before.reference.next_logits.argmax() == after.reference.next_logits.argmax())
        print(f"{args.task}@{length} ({len(ids)} prompt tokens), load average {statistics.median(loads):.1f}; "
              f"reference next-token logits moved by {moved:.2e} at most, greedy token {'equal' if same else 'DIFFERS'}"
              f"; {args.method}'s kept positions shared in {100 * statistics.mean(kept) if kept else 100:.2f}% "
              f"over {len(kept)} compressed layers")
        for side in SIDES:
            print(f"  {side:22s} forward wall {statistics.median(forward_s[side]):7.1f} s, call CPU "
                  f"{statistics.median(cpu_s[side]):7.1f} s  (per round: "
                  f"{', '.join(f'{w:.1f}/{c:.1f}' for w, c in zip(forward_s[side], cpu_s[side]))})")
        ratio = statistics.median(a / b for a, b in zip(cpu_s[SIDES[1]], cpu_s[SIDES[0]]))
        print(f"  banded / whole mask: CPU {ratio:.2f}x (median of the rounds' ratios)")
        del before, after, outputs


if __name__ == "__main__":
    main()
