#!/usr/bin/env python
"""Where a benchmark run's time goes, phase by phase: a pytest run under cProfile, its profile read back per phase.

The run is `python -m cProfile -o PROFILE -m pytest ...` in a fresh process (everything after `--` goes to pytest
unchanged); then, or from an existing `--profile` alone, the cumulative seconds of the functions that own each phase
of an item's work are printed with their share of the benchmark's items (wiring/fixture.run):

- model load: engine/models.ModelCache._load (a cached GGUF conversion included);
- shared prefill: runtime/shared_prefill.shared_prefill, each sample's one forward and the members' selections;
- reference decode: engine/sample_decoding.decode_reference, the full cache's greedy decode (with its
  log-probs), minus its fidelity reference (reference_of);
- members decoded alone (each member's first sample, engine/group_decode): engine/sample_decoding.decode_compressed
  (its generate), minus its teacher forcing and its fidelity_of;
- members' batched decode (the later samples): runtime/batched_generation._generate_rows, minus its teacher forcing;
- teacher forcing: generation.teacher_force_copy (alone) + batched_generation._teacher_forced_rows (batched);
- fidelity and scoring: engine/fidelity.fidelity_of + reference_of, and the tasks' `score` functions.

cProfile's clock is wall time: on a shared machine read the shares, not the seconds (the CPU seconds of the whole
run are printed beside them, from getrusage).

    python scripts/measure/profile_sample_phases.py --profile /tmp/p8k.prof -- bench/test_ruler.py \\
        --kvbench-model gemma3-270m --kvbench-methods full,snapkv,streamingllm,h2o --kvbench-budgets m0.125 \\
        --kvbench-tasks niah_single_1 --kvbench-context-lengths 8192 --kvbench-samples 2 --kvbench-torch-threads 1
"""

from __future__ import annotations

import argparse
import os
import pstats
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# engine/sample_decoding.py: a sample's reference, and a member decoded alone (each with its fidelity, counted apart)
REFERENCE = ("pytest_kvbench/engine/sample_decoding.py", "decode_reference")
COMPRESSED = ("pytest_kvbench/engine/sample_decoding.py", "decode_compressed")
REFERENCE_OF = ("pytest_kvbench/engine/fidelity.py", "reference_of")
FIDELITY_OF = ("pytest_kvbench/engine/fidelity.py", "fidelity_of")


def _key(stats: dict, path_end: str, name: str):
    return next((key for key in stats if key[0].endswith(path_end) and key[2] == name), None)


def _cumulative(stats: dict, path_end: str, name: str) -> float:
    key = _key(stats, path_end, name)
    return 0.0 if key is None else stats[key][3]


def _via(stats: dict, callee: tuple[str, str], caller: tuple[str, str]) -> float:
    """The cumulative seconds of `callee` when called from `caller` (each a (path end, function name))."""
    key, by = _key(stats, *callee), _key(stats, *caller)
    return 0.0 if key is None or by is None or by not in stats[key][4] else stats[key][4][by][3]


def phases(profile: str) -> tuple[dict[str, float], float]:
    """Seconds per phase, and the benchmark items' own seconds (the shares' denominator)."""
    stats = pstats.Stats(profile).stats
    alone_forcing = _cumulative(stats, "kvmethods/runtime/generation.py", "teacher_force_copy")
    batched_forcing = _cumulative(stats, "kvmethods/runtime/batched_generation.py", "_teacher_forced_rows")
    scoring = sum(values[3] for (path, _, name), values in stats.items()
                  if name == "score" and "pytest_kvbench/tasks/" in path)
    table = {
        "model load": _cumulative(stats, "pytest_kvbench/engine/models.py", "_load"),
        "shared prefill": _cumulative(stats, "kvmethods/runtime/shared_prefill.py", "shared_prefill"),
        "reference decode": _cumulative(stats, *REFERENCE) - _via(stats, REFERENCE_OF, REFERENCE),
        "members decoded alone": _cumulative(stats, *COMPRESSED) - _via(stats, FIDELITY_OF, COMPRESSED) - alone_forcing,
        "members' batched decode": _cumulative(stats, "kvmethods/runtime/batched_generation.py", "_generate_rows")
        - batched_forcing,
        "teacher forcing": alone_forcing + batched_forcing,
        "fidelity and scoring": _cumulative(stats, "pytest_kvbench/engine/fidelity.py", "fidelity_of")
        + _cumulative(stats, "pytest_kvbench/engine/fidelity.py", "reference_of") + scoring,
    }
    items = _cumulative(stats, "pytest_kvbench/wiring/fixture.py", "run")
    return table, items


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", help="where the profile is written (or read, without pytest arguments)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then the pytest arguments")
    args = parser.parse_args(argv)
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    if not pytest_args and not args.profile:
        parser.error("give pytest arguments after --, or --profile of an existing run")
    profile = args.profile or tempfile.mkstemp(suffix=".prof")[1]
    if pytest_args:
        load = os.getloadavg()[0]
        environment = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
        subprocess.run([sys.executable, "-m", "cProfile", "-o", profile, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        *pytest_args], cwd=ROOT, env=environment, check=True)
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        print(f"pytest {' '.join(pytest_args)}: {usage.ru_utime + usage.ru_stime:.1f} CPU s, load average "
              f"{load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    table, items = phases(profile)
    print(f"{'phase':26s} {'wall s':>8s} {'share':>6s}   (of the items' {items:.1f} s)")
    for name, seconds in table.items():
        print(f"{name:26s} {seconds:8.1f} {100 * seconds / items:5.1f}%")
    rest = items - sum(table.values())
    print(f"{'the rest':26s} {rest:8.1f} {100 * rest / items:5.1f}%")


if __name__ == "__main__":
    main()
