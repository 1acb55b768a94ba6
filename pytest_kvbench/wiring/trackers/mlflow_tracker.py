"""``--kvbench-mlflow URI``: the run logged to an MLflow tracking store (a ``file:`` store or an ``http:`` server).

One MLflow run per kvbench run, in the experiment ``MLFLOW_EXPERIMENT_NAME`` (default ``kvbench``), named and
tagged by the kvbench run id, so that ``--kvbench-resume`` finds it again and continues it. The client
(``mlflow-skinny``, the ``[mlflow]`` extra) is imported only when the option is given; a URI that does not
answer is refused at startup by one cheap call without retries (docs/trackers.md).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path

from pytest_kvbench.wiring.trackers.errors import TrackerSetupError, one_line

EXPERIMENT = "kvbench"
CHECK_TIMEOUT_S = "5"  # the startup call: a server that does not answer in 5 s is refused
# during the run, unless the user set them: a server gone mid-run stalls an item for seconds, not minutes
RUN_HTTP_SETTINGS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


@contextmanager
def _environment(settings: dict[str, str]):
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _client(uri: str):
    try:
        from mlflow import MlflowClient  # lazy: the optional [mlflow] extra, imported only when asked for
    except ImportError:
        raise TrackerSetupError("--kvbench-mlflow needs the mlflow client, which is not installed: "
                                "pip install 'pytest-kvbench[mlflow]'") from None
    return MlflowClient(tracking_uri=uri)


class MlflowTracker:
    name = "MLflow"

    def __init__(self, uri: str) -> None:
        self.uri = uri
        self.client = None
        self.run = None  # the MLflow run id

    def check(self) -> None:
        """One cheap call (an experiment search) with no retries and a short timeout: TrackerSetupError if the
        store does not answer."""
        if self.uri.startswith("file:"):  # asked for by name: MLflow 3.7+ refuses a file store unless told
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        try:
            client = _client(self.uri)
            with _environment({"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": CHECK_TIMEOUT_S}):
                client.search_experiments(max_results=1)
        except TrackerSetupError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the store is the same answer: it cannot be used
            raise TrackerSetupError(f"--kvbench-mlflow {self.uri}: the tracking store does not answer "
                                    f"({one_line(exc)})") from None
        self.client = client
        for name, value in RUN_HTTP_SETTINGS.items():
            os.environ.setdefault(name, value)

    def start(self, run_id: str, params: dict[str, str], tags: dict[str, str]) -> str:
        """Create the MLflow run, or find the one an earlier attempt of this kvbench run made and continue it."""
        client = self.client or _client(self.uri)
        self.client = client
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or EXPERIMENT
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
        found = client.search_runs([experiment_id], filter_string=f"tags.`kvbench.run_id` = '{run_id}'", max_results=1)
        if found:
            self.run = found[0].info.run_id
            client.update_run(self.run, status="RUNNING")
        else:
            self.run = client.create_run(experiment_id, run_name=run_id).info.run_id
        from mlflow.entities import Param, RunTag  # lazy: the optional [mlflow] extra

        known = found[0].data.params if found else {}
        client.log_batch(self.run, params=[Param(k, v) for k, v in params.items() if k not in known],
                         tags=[RunTag(k, v) for k, v in tags.items()])
        return f"MLflow run {self.run} at {self.uri}"

    def log_item(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric  # lazy: the optional [mlflow] extra

        stamp = int(time.time() * 1000)
        self.client.log_batch(self.run, metrics=[Metric(k, v, stamp, step) for k, v in metrics.items()])

    def finish(self, status: str, files: list[Path], table: tuple[list[str], list[list]]) -> None:
        columns, rows = table
        if rows:
            self.client.log_dict(self.run, [dict(zip(columns, row)) for row in rows], "items.json")
        for path in files:
            self.client.log_artifact(self.run, str(path))
        self.client.set_terminated(self.run, status=status)
