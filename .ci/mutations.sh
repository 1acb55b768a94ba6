#!/usr/bin/env bash
# The mutation suite (issue 37): every bug of .ci/mutations.toml applied to a copy of the tree must make the CI gates
# (the smoke gate, and the real-model gate for its methods) FAIL; at least 90% must be caught. .ci/run runs it right
# after the unmodified gates passed (the control); `--control N` reruns the unmodified gates N times here.
# Two mutations at a time on two cores (one tree copy each, OMP_NUM_THREADS=1). Table and timings: docs/baselines.md.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
python .ci/mutations.py --jobs "${KVBENCH_MUTATION_JOBS:-2}" "$@"
