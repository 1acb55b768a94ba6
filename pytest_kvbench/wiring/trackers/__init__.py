"""Trackers: a run logged live to MLflow (``--kvbench-mlflow``) or Weights & Biases (``--kvbench-wandb``).

They ride on the run: each finished item's record (the ``pytest_kvbench_record`` hook; under xdist the controller
reads the records file, since only it talks to a tracker), and the run's end once its files are written. A
tracker is never a reason to lose a benchmark: one failing mid-run is said once in the summary (docs/trackers.md).
"""
