"""``--kvbench-wandb PROJECT``: the run logged to a Weights & Biases project, the same content as MLflow's.

The W&B run's id is the kvbench run id, so ``--kvbench-resume`` continues it (``resume="allow"``). It honours
``WANDB_MODE=offline``: a cluster without network writes a run directory (under ``WANDB_DIR``, else ``./wandb``)
that ``wandb sync`` uploads later. Online, the W&B server is asked once at startup, with a short timeout. The
client (the ``[wandb]`` extra) is imported only when the option is given (docs/trackers.md).
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

from pytest_kvbench.wiring.trackers.content import FINISHED
from pytest_kvbench.wiring.trackers.errors import TrackerSetupError, one_line

CHECK_TIMEOUT_S = 5
OFFLINE_MODES = ("offline", "dryrun", "disabled")


def _wandb():
    try:
        import wandb  # lazy: the optional [wandb] extra, imported only when asked for
    except ImportError:
        raise TrackerSetupError("--kvbench-wandb needs the wandb client, which is not installed: "
                                "pip install 'pytest-kvbench[wandb]'") from None
    return wandb


def _wandb_id(run_id: str) -> str:
    """W&B run ids take letters, digits, ``-`` and ``_``: a kvbench run id is already one."""
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in run_id)


class WandbTracker:
    name = "W&B"

    def __init__(self, project: str) -> None:
        self.project = project
        self.run = None
        self.wandb = None

    def check(self) -> None:
        self.wandb = _wandb()
        if os.environ.get("WANDB_MODE", "").lower() in OFFLINE_MODES:
            return
        base = os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
        try:
            urllib.request.urlopen(base, timeout=CHECK_TIMEOUT_S).close()
        except urllib.error.HTTPError:
            return  # it answered (an error page is an answer)
        except (OSError, ValueError) as exc:
            raise TrackerSetupError(f"--kvbench-wandb {self.project}: the W&B server {base} does not answer "
                                    f"({one_line(exc)}); WANDB_MODE=offline logs to a local directory for "
                                    f"`wandb sync`") from None

    def start(self, run_id: str, params: dict[str, str], tags: dict[str, str]) -> str:
        wandb = self.wandb or _wandb()
        settings = wandb.Settings(console="off", quiet=True, x_disable_stats=True, save_code=False)
        self.run = wandb.init(project=self.project, id=_wandb_id(run_id), name=run_id, resume="allow",
                              job_type="kvbench", config=params | tags, settings=settings)
        where = "offline run directory " + str(Path(self.run.dir).parent) if self.run.offline else self.run.url
        return f"W&B run {self.run.id} ({where})"

    def log_item(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics | {"items_done": step}, step=step)

    def finish(self, status: str, files: list[Path], table: tuple[list[str], list[list]]) -> None:
        wandb = self.wandb or _wandb()
        columns, rows = table
        if rows:
            self.run.log({"items": wandb.Table(columns=columns, data=rows)})
        self.run.summary["kvbench_status"] = status
        if files:
            artifact = wandb.Artifact(f"kvbench-{_wandb_id(str(self.run.name))}", type="kvbench-run")
            for path in files:
                artifact.add_file(str(path))
            self.run.log_artifact(artifact)
        self.run.finish(exit_code=0 if status == FINISHED else 1)
