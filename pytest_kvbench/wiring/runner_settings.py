"""The worker's Runner, built when the first benchmark item needs it, from settings fixed at configure.

engine/ imports torch and transformers. The plugin is loaded in every pytest run of its users, most of
which run no benchmark item, and `--collect-only` runs none either: configure only records what the
Runner will be built from (and checks it), collection records the cases that share prefills, and the
Runner, torch's thread count and the shared-prefill plan come when an item runs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import pytest

from pytest_kvbench.cases import Grid
from pytest_kvbench.engine.hardware.cpu_count import usable_cpu_count
from pytest_kvbench.wiring.stash_keys import ENGINE_ITEMS_KEY, PLANNED_CASES_KEY, RUNNER_KEY, RUNNER_SETTINGS_KEY, SHARING_GROUPS_KEY


@dataclass(frozen=True)
class RunnerSettings:
    grid: Grid
    run_id: str
    timeout_s: float | None
    torch_threads: int | None  # --kvbench-torch-threads (checked at configure), or a worker's share: worker_threads
    share_prefill: bool = True
    decode_batch: int | str = 1  # --kvbench-decode-batch (checked at configure): "auto" or members per batch


def worker_threads(given: int | None, workers: int | None, environ: Mapping[str, str] = os.environ) -> int | None:
    """Torch's CPU threads in this process: as given (--kvbench-torch-threads); in one of `workers` xdist workers
    told nothing (no option, no OMP_NUM_THREADS), its share of the cores this process may run on. Torch's own
    default is a thread per core in every process: `-n 2` on a 2-core machine ran 4 threads on 2 cores, and
    threads that wait for each other at every operation lose most of their time when others hold the cores
    (docs/real-model.md). None: torch's default (a single process, or the environment decides)."""
    if given is not None or not workers or "OMP_NUM_THREADS" in environ:
        return given
    return max(1, usable_cpu_count() // workers)


def runner_of(config: pytest.Config):
    """This process's Runner (engine/runner.py), built on first use with its shared-prefill plan."""
    runner = config.stash.get(RUNNER_KEY, None)
    if runner is None:
        import torch  # lazy for startup time, as is the engine: an item is running now

        from pytest_kvbench.engine.runner import Runner

        settings = config.stash[RUNNER_SETTINGS_KEY]
        if settings.torch_threads is not None:
            torch.set_num_threads(settings.torch_threads)
        runner = config.stash[RUNNER_KEY] = Runner(settings.grid, settings.run_id, settings.timeout_s,
                                                   share_prefill=settings.share_prefill,
                                                   decode_batch=settings.decode_batch)
        runner.shared.plan(config.stash.get(PLANNED_CASES_KEY, []), config.stash.get(SHARING_GROUPS_KEY, None))
    return runner


def engine_items_of(config: pytest.Config):
    """This process's serving-engine items (serving/engine_item.py) over its Runner, built on first use: one
    llama.cpp engine per cache types, with the worker's torch thread count."""
    items = config.stash.get(ENGINE_ITEMS_KEY, None)
    if items is None:
        import torch  # lazy for startup time: an item is running now

        from pytest_kvbench.serving.engine_item import EngineItems
        from pytest_kvbench.serving.llamacpp.backend import LlamaCppBackend

        items = config.stash[ENGINE_ITEMS_KEY] = EngineItems(runner_of(config), LlamaCppBackend,
                                                             threads=torch.get_num_threads())
    return items
