#!/usr/bin/env python
"""Decode time of reference groups, sequential against batched (one sample, across samples), on the real model.

`--samples` samples of a task (default: the real-model job's niah_single_1 at 2,048 tokens on SmolLM2-135M) are
prefilled once per round for the reference and the job's members (bench/configs/smollm2-135m.toml: every
method x budget but `full`); then the groups are decoded as the runner does it, each member teacher-forced on
its sample's reference output (fidelity) and decoded greedily, by each variant in turn, from copies of the same
prefilled caches:

- sequential: per sample, the reference, then each member alone (--kvbench-decode-batch 1);
- batched: per sample, the reference alone (its output is the members' targets), then the sample's members in
  one batch per kind (runtime/batched_generation.batch_kind: dense and ragged caches padded together,
  quantized ones together);
- across: each sample's reference alone, then the members of all the samples in one batch per kind (batching
  across samples: each row at its own positions, teacher-forced on its own sample's reference);
- across+refs: as across, but the samples' references decode together first, in one padded batch of their own
  (their full caches all held until then), then the members across samples;
- across+ref (issue 36 item 1, "the reference joins the batch"): as across, but each sample's reference decodes
  as one more row of the padded batch, beside the members (their greedy decoding does not depend on it), and the
  members are teacher-forced on it afterwards (batched_generation's targets_of); every padded row then attends
  over the full cache's length.

The prefill and the copies are not timed. The variants alternate within each round so that load on a shared
machine hits them alike; per round the wall and CPU seconds (this process, one torch thread) of the decoding are
printed, then the medians, each variant's CPU ratio to the first of --variants (median of per-round ratios; by
default sequential), the same ratio for the members alone (less the CPU of the references decoded alone, which
sequential, batched and across pay alike: the issue's "a batched group of 12 members"), the 1-minute load average,
and whether every member's tokens are the same as the first's (the first divergence with both log-probs otherwise).

    python scripts/measure/measure_batched_decode.py --repeat 2 --samples 3
    python scripts/measure/measure_batched_decode.py --model /work/models/gemma-3-270m-q4_k_m.gguf --members 12 \
        --variants sequential,batched --new-tokens 32 --repeat 2

`--members N` takes the first N of the grid's members (method-major: 12 are the first four methods at the three
budgets), `--new-tokens` caps the decoding (the task's own otherwise), `--model` takes a named model or a .gguf file.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
import tomllib

import common  # noqa: F401 - this checkout's packages on sys.path

import torch

from kvmethods import Budget, get_method
from kvmethods.runtime.batched_generation import PADDED, BatchRequest, batch_kind, generate_batch
from kvmethods.runtime.generation import generate
from kvmethods.runtime.shared_prefill import shared_prefill
from pytest_kvbench.engine.models import ModelCache
from pytest_kvbench.tasks import get_task

CONFIG = common.ROOT / "bench" / "configs" / "smollm2-135m.toml"
VARIANTS = ("sequential", "batched", "across", "across+refs", "across+ref")


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


def _targets(out) -> list[int]:
    return out.tokens + ([out.stop_token] if out.stop_token is not None else [])


def _reference(model, shared, prompt, new_tokens, eos):
    return generate(model, get_method("full"), None, prompt.input_ids, prompt.context_len, new_tokens, eos,
                    "question_in_window", return_logprobs=True, prefilled=shared.reference)


def decode_groups(model, groups, requests, new_tokens, eos, variant: str) -> tuple[float, float, list, list, float]:
    """(wall s, CPU s, reference outputs, member outputs per sample, CPU s of the references decoded alone) of
    decoding the groups (prompt, shared prefill) of several samples under `variant`."""
    wall, cpu = time.perf_counter(), time.process_time()
    alone = [0.0]

    def reference(shared, prompt):
        started = time.process_time()
        out = _reference(model, shared, prompt, new_tokens, eos)
        alone[0] += time.process_time() - started
        return out

    outputs = [[None] * len(requests) for _ in groups]
    references: list = [None] * len(groups)
    batches: list[list[tuple[int, int | None]]] = []  # (sample, member or None: the reference) per batch
    kinds: dict[str, list[tuple[int, int | None]]] = {}
    if variant == "across+refs":
        batches.append([(s, None) for s in range(len(groups))])
    for s, (prompt, shared) in enumerate(groups):
        if variant not in ("across+ref", "across+refs"):
            references[s] = reference(shared, prompt)
        else:
            kinds.setdefault(PADDED, []).append((s, None))
        for n, ((method, _), state) in enumerate(zip(requests, shared.selections)):
            kind = batch_kind(method, state) if variant != "sequential" else None
            if kind is not None:
                kinds.setdefault(kind, []).append((s, n))
        if variant == "batched":
            batches += kinds.values()
            kinds = {}
    if variant == "across+refs" and len(groups) == 1:  # one reference: alone, as across
        batches.pop(0)
        references[0] = reference(groups[0][1], groups[0][0])
    batches += kinds.values()
    for rows in batches:
        made = generate_batch(model, [_request(groups, requests, s, n) for s, n in rows], None, new_tokens, eos,
                              return_logprobs=True, targets_of=lambda outs, rows=rows: _targets_of(rows, outs,
                                                                                                   references))
        for (s, n), out in zip(rows, made):
            if n is None:
                references[s] = out
            else:
                outputs[s][n] = out
    for s, (prompt, shared) in enumerate(groups):
        for n, (method, budget) in enumerate(requests):
            if outputs[s][n] is None:
                outputs[s][n] = generate(model, method, budget, prompt.input_ids, prompt.context_len, new_tokens, eos,
                                         "question_in_window", teacher_targets=_targets(references[s]),
                                         return_logprobs=True, prefilled=shared.selections[n])
    return time.perf_counter() - wall, time.process_time() - cpu, references, outputs, alone[0]


def _request(groups, requests, s: int, n: int | None) -> BatchRequest:
    prompt, shared = groups[s]
    if n is None:
        return BatchRequest(get_method("full"), None, shared.reference, len(prompt.input_ids))
    return BatchRequest(*requests[n], shared.selections[n], len(prompt.input_ids))


def _targets_of(rows, outs, references) -> list:
    """Each row's targets: its sample's reference, decoded earlier or as a row of this batch (None for that row)."""
    produced = {s: out for (s, n), out in zip(rows, outs) if n is None}
    return [None if n is None else _targets(produced.get(s) or references[s]) for s, n in rows]


def divergence(a, b) -> str | None:
    for step, (x, y) in enumerate(zip(a.tokens + [a.stop_token], b.tokens + [b.stop_token])):
        if x != y:
            return (f"step {step}: baseline {x} (log-p {float(a.logprobs[step][x]):.5f}, {y}: "
                    f"{float(a.logprobs[step][y]):.5f}), this variant {y} (log-p {float(b.logprobs[step][y]):.5f})")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds; medians are printed")
    parser.add_argument("--samples", type=int, default=1, help="samples decoded per round (across: together)")
    parser.add_argument("--variants", default="sequential,batched,across,across+ref",
                        help=f"comma-separated, of {', '.join(VARIANTS)}; the first is the baseline")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--task", default="niah_single_1")
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--config", default=str(CONFIG), help="TOML grid whose methods x budgets are the members")
    parser.add_argument("--members", type=int, default=0, help="the first N members of the grid (0: all)")
    parser.add_argument("--new-tokens", type=int, default=0, help="tokens decoded at most (0: the task's own)")
    parser.add_argument("--dtype", default="auto", help="the harness's --kvbench-dtype (auto: float32 on CPU)")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    if not variants or set(variants) - set(VARIANTS) or len(set(variants)) < len(variants):
        parser.error(f"--variants: any of {', '.join(VARIANTS)}, the first the baseline")
    torch.set_num_threads(1)
    loaded, _ = ModelCache().get(args.model, args.dtype)
    task = get_task(args.task)
    samples = task.load_samples(loaded.tokenizer, n=args.samples, seed=0, data_dir=None,
                                context_length=args.context_length)
    prompts = [task.build_prompt(sample, loaded.tokenizer, None) for sample in samples]
    requests = members_of(type(CONFIG)(args.config))
    requests = requests[: args.members or len(requests)]
    new_tokens = args.new_tokens or task.max_new_tokens
    print(f"{args.model}, {args.task} at {args.context_length} ({[len(p.input_ids) for p in prompts]} prompt tokens), "
          f"{len(requests)} members + the reference per sample, {len(samples)} samples, max {new_tokens} "
          f"new tokens, {loaded.dtype}, 1 torch thread")
    times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in variants}
    members: dict[str, list[float]] = {name: [] for name in variants}  # CPU s less the references decoded alone
    runs: dict[str, tuple] = {}
    for round_number in range(args.repeat):
        prefilled = [(prompt, shared_prefill(loaded.model, requests, prompt.input_ids, prompt.context_len,
                                             "question_in_window")) for prompt in prompts]
        for name in variants:
            groups = [(prompt, copy.deepcopy(shared)) for prompt, shared in prefilled]
            load = os.getloadavg()[0]
            wall, cpu, references, outputs, alone = decode_groups(loaded.model, groups, requests, new_tokens,
                                                                  loaded.eos_token_ids, name)
            times[name].append((wall, cpu, load))
            members[name].append(cpu - alone)
            runs[name] = (references, outputs)
            print(f"round {round_number + 1} {name:10s} wall {wall:6.2f} s  CPU {cpu:6.2f} s  (references alone "
                  f"{alone:5.2f})  load {load:4.1f}", flush=True)
    base = times[variants[0]]
    for name, rounds in times.items():
        wall, cpu, load = (statistics.median(r[i] for r in rounds) for i in range(3))
        ratio = statistics.median(r[1] / s[1] for s, r in zip(base, rounds))
        own = statistics.median(r / s for s, r in zip(members[variants[0]], members[name]))
        print(f"{name:10s} median wall {wall:6.2f} s, CPU {cpu:6.2f} s, load {load:4.1f}; CPU / {variants[0]} "
              f"{ratio:.2f}x; the members alone (less the references decoded alone) {own:.2f}x")
    sequential_refs, sequential = runs[variants[0]]
    for name in variants[1:]:
        references, outputs = runs[name]
        same, worst = 0, 0.0
        for s in range(len(samples)):
            if divergence(sequential_refs[s], references[s]) is not None:
                print(f"  {name}: sample {s} reference: {divergence(sequential_refs[s], references[s])}")
            for (method, budget), a, b in zip(requests, sequential[s], outputs[s]):
                parted = divergence(a, b)
                if parted is None:
                    same += 1
                    worst = max(worst, float((a.logprobs - b.logprobs).abs().max()),
                                float((a.target_logprobs - b.target_logprobs).abs().max()))
                else:
                    print(f"  {name}: sample {s} {method.name}@{budget.spec}: {parted}")
        print(f"{name}: same tokens as {variants[0]}: {same} of {len(requests) * len(samples)} (member, sample) pairs; "
              f"largest log-prob difference where equal: {worst:.2e}")


if __name__ == "__main__":
    main()
