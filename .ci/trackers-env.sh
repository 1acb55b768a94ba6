#!/usr/bin/env bash
# CI's trackers environment: the [mlflow] and [wandb] extras (pinned in constraints.txt) and a real MLflow tracking
# server, on top of the main environment (.ci/run installed it; --system-site-packages). Runs the trackers' tests:
# a loopback `mlflow server` read back with MlflowClient (params, every item's metrics, artifacts, FINISHED; an
# interrupted run KILLED, its resume the same MLflow run), a file: store failing mid-run, W&B offline read back
# from its run directory. Those tests skip in the main environment (.ci/check_skips.py expects it there); here
# every one must run: a skip fails this step (--env trackers).
# The server (`mlflow`, not the extra's `mlflow-skinny`) wants pyarrow<26 and, through graphene, python-dateutil<3,
# older than constraints.txt's pins: it is installed with its pin alone, and pip puts those two in this venv only.
# Cost on a 2-core machine: see docs/trackers.md ("What CI runs").
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

VENV="${TMPDIR:-/tmp}/kvbench-ci-trackers"
python -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[mlflow,wandb]"
"$VENV/bin/python" -m pip install -q "$(grep '^mlflow==' constraints.txt | cut -d' ' -f1)"
"$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider --junitxml="$VENV/tests.xml" \
  tests/plugin/test_trackers_mlflow.py tests/plugin/test_trackers_wandb.py tests/plugin/test_trackers_options.py
"$VENV/bin/python" .ci/check_skips.py "$VENV/tests.xml" --env trackers
