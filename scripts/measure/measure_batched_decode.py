#!/usr/bin/env python
"""Decode time of one sample's reference group, batched against sequential, on the real model (issue 36).

One sample of a task (default: the real-model job's niah_single_1 at 2,048 tokens on SmolLM2-135M) is
prefilled once per round for the reference and the job's members (bench/configs/smollm2-135m.toml: every
method x budget but `full`); then the group is decoded as the runner does it, each member teacher-forced on
the reference's output (fidelity) and decoded greedily:

- sequential: the reference, then each member alone (--kvbench-decode-batch 1);
- batched: the reference alone (its output is the members' targets), then the members in one batch per kind
  (runtime/batched_generation.batch_kind: dense and ragged caches padded together, quantized ones together).

The prefill is not timed. The two variants alternate (sequential, batched, sequential, ...) so that load on a
shared machine hits both alike; per round the wall and CPU seconds (this process, one torch thread) of the
decoding are printed, then the medians and their ratio, the 1-minute load average, and whether every member's
tokens are the same in both (the first divergence with both log-probs otherwise).

    python scripts/measure/measure_batched_decode.py --repeat 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import tomllib

import common  # noqa: F401 - this checkout's packages on sys.path

import torch

from kvmethods import Budget, get_method
from kvmethods.runtime.batched_generation import BatchRequest, batch_kind, generate_batch
from kvmethods.runtime.generation import generate
from kvmethods.runtime.shared_prefill import shared_prefill
from pytest_kvbench.engine.models import ModelCache
from pytest_kvbench.tasks import get_task

CONFIG = common.ROOT / "bench" / "configs" / "smollm2-135m.toml"


def members_of(config_path) -> list[tuple]:
    config = tomllib.loads(config_path.read_text())
    methods = []
    for entry in config["methods"]:
        name, params = (entry, {}) if isinstance(entry, str) else (entry["name"], {k: v for k, v in entry.items()
                                                                                   if k != "name"})
        if name != "full":
            methods.append((name, params))
    return [(get_method(name, **params), Budget.parse(budget)) for name, params in methods
            for budget in config["budgets"]]


def decode_group(model, shared, requests, prompt, new_tokens, eos, batched: bool) -> tuple[float, float, list, list]:
    """(wall s, CPU s, reference output, member outputs) of decoding the group of a shared prefill."""
    wall, cpu = time.perf_counter(), time.process_time()
    reference = generate(model, get_method("full"), None, prompt.input_ids, prompt.context_len, new_tokens, eos,
                         "question_in_window", return_logprobs=True, prefilled=shared.reference)
    targets = reference.tokens + ([reference.stop_token] if reference.stop_token is not None else [])
    outputs: list = [None] * len(requests)
    kinds: dict[str, list[int]] = {}
    for n, ((method, _), state) in enumerate(zip(requests, shared.selections)):
        kind = batch_kind(method, state) if batched else None
        if kind is not None:
            kinds.setdefault(kind, []).append(n)
    for together in kinds.values():
        made = generate_batch(model, [BatchRequest(*requests[n], shared.selections[n]) for n in together],
                              len(prompt.input_ids), new_tokens, eos, teacher_targets=targets, return_logprobs=True)
        for n, out in zip(together, made):
            outputs[n] = out
    for n, (method, budget) in enumerate(requests):
        if outputs[n] is None:
            outputs[n] = generate(model, method, budget, prompt.input_ids, prompt.context_len, new_tokens, eos,
                                  "question_in_window", teacher_targets=targets, return_logprobs=True,
                                  prefilled=shared.selections[n])
    return time.perf_counter() - wall, time.process_time() - cpu, reference, outputs


def divergence(a, b) -> str | None:
    for step, (x, y) in enumerate(zip(a.tokens + [a.stop_token], b.tokens + [b.stop_token])):
        if x != y:
            return (f"step {step}: sequential {x} (log-p {float(a.logprobs[step][x]):.5f}, {y}: "
                    f"{float(a.logprobs[step][y]):.5f}), batched {y} (log-p {float(b.logprobs[step][y]):.5f})")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds; medians are printed")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--task", default="niah_single_1")
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--config", default=str(CONFIG), help="TOML grid whose methods x budgets are the members")
    args = parser.parse_args()
    torch.set_num_threads(1)
    loaded, _ = ModelCache().get(args.model)
    task = get_task(args.task)
    sample = task.load_samples(loaded.tokenizer, n=1, seed=0, data_dir=None, context_length=args.context_length)[0]
    prompt = task.build_prompt(sample, loaded.tokenizer, None)
    requests = members_of(type(CONFIG)(args.config))
    print(f"{args.model}, {args.task} at {args.context_length} ({len(prompt.input_ids)} prompt tokens), "
          f"{len(requests)} members + the reference, max {task.max_new_tokens} new tokens, 1 torch thread")
    times: dict[str, list[tuple[float, float, float]]] = {"sequential": [], "batched": []}
    runs: dict[str, tuple] = {}
    for round_number in range(args.repeat):
        for name in times:
            shared = shared_prefill(loaded.model, requests, prompt.input_ids, prompt.context_len,
                                    "question_in_window")
            load = os.getloadavg()[0]
            wall, cpu, reference, outputs = decode_group(loaded.model, shared, requests, prompt, task.max_new_tokens,
                                                         loaded.eos_token_ids, name == "batched")
            times[name].append((wall, cpu, load))
            runs[name] = (reference, outputs)
            print(f"round {round_number + 1} {name:10s} wall {wall:6.2f} s  CPU {cpu:6.2f} s  load {load:4.1f}",
                  flush=True)
    medians = {name: tuple(statistics.median(r[i] for r in rounds) for i in range(3)) for name, rounds in times.items()}
    for name, (wall, cpu, load) in medians.items():
        print(f"{name:10s} median wall {wall:6.2f} s, CPU {cpu:6.2f} s, load {load:4.1f}")
    (s_wall, s_cpu, _), (b_wall, b_cpu, _) = medians["sequential"], medians["batched"]
    ratios = [b[1] / s[1] for s, b in zip(times["sequential"], times["batched"])]
    print(f"batched / sequential: wall {b_wall / s_wall:.2f}x, CPU {b_cpu / s_cpu:.2f}x "
          f"(median of per-round CPU ratios {statistics.median(ratios):.2f}x)")
    (_, sequential), (_, batched) = runs["sequential"], runs["batched"]
    same = 0
    worst = 0.0
    for (method, budget), a, b in zip(requests, sequential, batched):
        parted = divergence(a, b)
        if parted is None:
            same += 1
            worst = max(worst, float((a.logprobs - b.logprobs).abs().max()),
                        float((a.target_logprobs - b.target_logprobs).abs().max()))
        else:
            print(f"  {method.name}@{budget.spec}: {parted}")
    print(f"same tokens: {same} of {len(requests)} members; largest log-prob difference where equal: {worst:.2e}")


if __name__ == "__main__":
    main()
