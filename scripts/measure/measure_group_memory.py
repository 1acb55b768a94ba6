"""Live tensor bytes a reference group holds while its items run with one shared prefill per sample.

Issue 19's bound: a worker may hold at most one sample's group of compressed caches beyond the full
cache in flight, never caches waiting for later items across samples. This runs a group (the
full-cache item first, then N sharing items: methods x budgets) on the embedded model in-process, like
a worker, and prints the tensor bytes held by the shared prefills and live beyond the model and the
fidelity references (cached by design) after every sample, and at the start of every compressed
decoding. Counting bytes, not timing: the figures do not depend on the machine's load.

    python scripts/measure/measure_group_memory.py --items 8 --samples 10
"""

from __future__ import annotations

import argparse

import common  # noqa: F401 (this checkout's packages first)
import torch

from kvmethods import Budget
from kvmethods.testing import live_tensor_bytes, tensors_reachable
from pytest_kvbench.cases import Grid, MethodSpec
from pytest_kvbench.engine.runner import Runner

METHODS = ["snapkv", "h2o", "streamingllm", "tova", "pyramidkv", "knorm", "random", "expected_attention"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=8, help="sharing items of the group (methods x budgets 16, r0.5)")
    parser.add_argument("--samples", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    grid = Grid(methods=[MethodSpec(m) for m in ["full", *METHODS]], budgets=[Budget.parse("16"), Budget.parse("r0.5")],
                tasks=["niah_single_1"], context_lengths=[256], samples=args.samples, data_dir="fixtures",
                max_prompt_tokens=320)
    cases = grid.cases("ruler", lambda task: "ruler")
    cases = cases[:1] + cases[1:][:args.items]
    runner = Runner(grid, "measure")
    runner.shared.plan(cases)
    runner.models.get("default", grid.dtype, grid.attn_implementation)
    base = live_tensor_bytes()

    def beyond_model_and_references() -> int:
        return live_tensor_bytes() - base - live_tensor_bytes(tensors_reachable(runner.references))

    held, between, in_flight = [], [], []
    decode = runner.prefills.compressed

    def measured_decode(*decode_args, **kwargs):
        in_flight.append(beyond_model_and_references())
        return decode(*decode_args, **kwargs)

    runner.prefills.compressed = measured_decode

    def progress(done: int, total: int, decoded: tuple = (), samples_decoded: int = 0) -> None:
        held.append(live_tensor_bytes(tensors_reachable(runner.shared)))
        between.append(beyond_model_and_references())

    records = [runner.run(case, progress) for case in cases]
    group = sum(r.samples[0]["kv_bytes_after"] for r in records[1:])
    print(f"group: full + {len(cases) - 1} sharing items ({', '.join(c.id for c in cases[1:])}), {args.samples} samples")
    print(f"bytes held by the shared prefills between samples: max {max(held):,}")
    print(f"live tensor bytes beyond the model and references between samples: max {max(between):,}")
    print(f"live tensor bytes at the start of a compressed decoding: max {max(in_flight):,} ({len(in_flight)} decodings)")
    print(f"one sample's group of compressed caches (kv_bytes_after summed over the items): {group:,}")


if __name__ == "__main__":
    main()
