#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one script for a lent GPU machine (docs/gpus.md, "Checked on a GPU").
#
# 1. The smoke subset on CUDA: once in bf16 (what `auto` picks on CUDA) and once in float32 against the CPU
#    baseline (results/baseline-smoke.json), so that a CUDA-only numeric difference shows as a gate verdict.
# 2. A real-size model of random weights (scripts/measure/random_model.py, Llama-3-8B's shape) on RULER needles at
#    8k and 32k tokens, for CUDA latency, peak memory, KV bytes and NVML energy per method. Its scores are
#    meaningless (random weights); only the cost columns are figures. Members decode one after another
#    (`--kvbench-decode-batch 1`): each record's decode tok/s is that method's own.
# 3. `batched`: the same grid with `--kvbench-decode-batch auto` (one batched forward per step for a sample's
#    members), for sequential against batched wall time (issue 36; each run's wall seconds are printed).
# 4. `decode`: every method's decode tok/s from one shared prefill at each context, alone
#    (scripts/measure/measure_method_decode.py --device cuda: the same compressed caches, decoded in turn, two
#    rounds), the figure issue 36 compares with full's (target >= 0.8x) and that showed the slow paths.
#
# Usage on the GPU machine, from the repository root: OUT=<folder> bash scripts/measure/device_check.sh
# STEPS="smoke random batched decode" (default) picks the steps; SHAPE, TASKS, CONTEXTS, SAMPLES, METHODS,
# DECODE_TOKENS and *_TIMEOUT the sizes.
# Missing Python packages travel as wheels in .whl/ (installed into /tmp/site first, when present).
set -uo pipefail
OUT=${OUT:-/tmp/kvbench-device}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"

keep() {  # a run's RESULTS.md and records under $OUT with a prefix (files come back two folders deep at most)
    cp "$1/RESULTS.md" "$OUT/$2-RESULTS.md"
    cat "$1"/runs/*/records.jsonl > "$OUT/$2-records.jsonl"
}

step() { echo "=== $1 ($(date +%T))"; }

STEPS=${STEPS:-smoke random batched decode}
METHODS=${METHODS:-full,snapkv,pyramidkv,streamingllm,h2o,tova,expected_attention,adakv,criticalkv,kvzip,kivi}
CONTEXTS=${CONTEXTS:-8192,32768}

if [[ " $STEPS " == *" smoke "* ]]; then
step "smoke, bf16"
timeout "${SMOKE_TIMEOUT:-150}" python3 -m pytest bench/ -m smoke -q -p no:cacheprovider --kvbench-results /tmp/smoke-bf16 \
    2>&1 | tail -4
keep /tmp/smoke-bf16 smoke-bf16

step "smoke, float32, against the CPU baseline"
timeout "${SMOKE_TIMEOUT:-150}" python3 -m pytest bench/ -m smoke -q -p no:cacheprovider --kvbench-dtype float32 \
    --kvbench-results /tmp/smoke-fp32 --kvbench-compare results/baseline-smoke.json 2>&1 | tail -25
keep /tmp/smoke-fp32 smoke-fp32
fi
[[ " $STEPS " == *" random "* || " $STEPS " == *" batched "* || " $STEPS " == *" decode "* ]] || exit 0

step "a random model of Llama-3-8B's shape"
python3 scripts/measure/random_model.py "${SHAPE:-llama-3-8b}" /tmp/random-model --device cuda 2>&1 | grep -v "Writing model"

ruler() {  # ruler <decode batch> <results folder>: the needle grid on the random model; prints its wall seconds
    local started=$SECONDS
    timeout "${RANDOM_TIMEOUT:-300}" python3 -m pytest bench/test_ruler.py -q -p no:cacheprovider --kvbench-model /tmp/random-model \
        --kvbench-tasks "${TASKS:-niah_single_1}" --kvbench-context-lengths "$CONTEXTS" --kvbench-samples "${SAMPLES:-2}" \
        --kvbench-methods "$METHODS" --kvbench-budgets 1024 --kvbench-decode-batch "$1" --kvbench-results "$2" 2>&1 | tail -6
    echo "wall: $((SECONDS - started)) s (--kvbench-decode-batch $1)"
}

if [[ " $STEPS " == *" random "* ]]; then
step "RULER needles on it, members decoded one after another"
ruler 1 /tmp/random-run
keep /tmp/random-run random-8b
fi

if [[ " $STEPS " == *" batched "* ]]; then
step "the same grid, members decoded in batches"
ruler auto /tmp/random-batched
keep /tmp/random-batched random-8b-batched
fi

if [[ " $STEPS " == *" decode "* ]]; then
for context in ${CONTEXTS//,/ }; do
    step "every method's decode alone at $context tokens"
    timeout "${DECODE_TIMEOUT:-300}" python3 scripts/measure/measure_method_decode.py --model /tmp/random-model --device cuda \
        --dtype bfloat16 --context-length "$context" --budget 1024 --methods "${METHODS/full,/}" \
        --tokens "${DECODE_TOKENS:-32}" --rounds 2 --state "/tmp/decode-state-$context.pt" 2>&1 \
        | grep -v "Loading weights" | tee "$OUT/decode-$context.txt"
done
fi
step "done"
