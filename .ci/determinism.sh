#!/usr/bin/env bash
# Determinism (issue 50 part 3): one item of every built-in method (seeded ones included: random, expected
# attention's sampling), run twice in two fresh processes, must give bitwise-equal records, every field but the
# timings, meters and run ids (.ci/same_results.py --exact). A method drawing from a global RNG, or any state
# carried between processes, fails here; the gates, whose tolerances absorb noise, would not see it.
# Cost on a 2-core machine: about 2 x 40 s (16 items of 2 samples at 256 tokens on the embedded model).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS=1
# every built-in, hf_quantized only where its quanto backend is installed (an optional extra)
METHODS="$(python -c "
import importlib.util
from kvmethods.core.catalog import BUILTINS
quanto = importlib.util.find_spec('optimum') is not None and importlib.util.find_spec('optimum.quanto') is not None
print(','.join(name for name in BUILTINS if name != 'hf_quantized' or quanto))")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for run in first second; do
  pytest bench/test_ruler.py -q -p no:cacheprovider --kvbench-methods "$METHODS" --kvbench-budgets 64 \
    --kvbench-tasks niah_single_1 --kvbench-context-lengths 256 --kvbench-samples 2 --kvbench-torch-threads 1 \
    --kvbench-results "$work/$run"
done
python .ci/same_results.py --exact "$work"/first/runs/* "$work"/second/runs/*
