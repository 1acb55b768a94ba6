"""The ``kvbench`` fixture a benchmark test uses: run its case, then gate the record.

A benchmark test reads ``record = kvbench.run(kvbench_case); kvbench.check(record)``. Running turns
the failures a user can act on (a model that will not load, data too short, out of memory) into one
paragraph instead of a traceback, and puts the headline figures in the item's user_properties
(junitxml shows them); checking asks the gate (--kvbench-compare) for a verdict and fails the item
on a significant regression or a settings mismatch.
"""

from __future__ import annotations

import pytest

from pytest_kvbench.results.record import Record
from pytest_kvbench.wiring.item_ids import item_id
from pytest_kvbench.wiring.runner_settings import engine_items_of, runner_of
from pytest_kvbench.wiring.stash_keys import GATE_KEY, PROGRESS_KEY, RECORD_KEY, VERDICT_KEY


class KvbenchFixture:
    def __init__(self, item: pytest.Item) -> None:
        self.item = item
        self.config = item.config

    def run(self, case) -> dict:
        # lazy for startup time: the engine imports torch (an item is running now)
        from pytest_kvbench.engine.models import ModelLoadError
        from pytest_kvbench.engine.out_of_memory import ItemOutOfMemory
        from pytest_kvbench.serving.backend import EngineDied, EngineStartError
        from pytest_kvbench.tasks import DataError, TaskError, TaskUnavailable

        # an engine's cache type (llamacpp:q8_0) runs in the serving engine, beside the worker's Runner
        runner = engine_items_of(self.config) if case.method.is_engine else runner_of(self.config)
        shown_id = item_id(self.config, case)  # the id pytest shows (wiring/item_ids.py)
        progress = self.config.stash[PROGRESS_KEY].item(case, shown_id)
        record = None
        try:
            record = runner.run(case, progress)
        except TaskUnavailable as exc:
            pytest.skip(str(exc))
        except (ModelLoadError, TaskError, DataError, EngineDied, EngineStartError) as exc:
            # bad input found only now (a model that will not load, data too short): one paragraph,
            # without the chain of exceptions behind it (pytest prints a chain even with pytrace=False)
            raise pytest.fail.Exception(f"{shown_id}: {exc}", pytrace=False) from None
        except ItemOutOfMemory as exc:  # the runner already freed the memory the item held
            raise pytest.fail.Exception(str(exc), pytrace=False) from None
        finally:
            progress.finish(record)
        self.item.stash[RECORD_KEY] = record
        self.item.user_properties += [
            ("kvbench_score", record.score), ("kvbench_metric", record.metric), ("kvbench_kl", record.fidelity.kl),
            ("kvbench_agreement", record.fidelity.agreement), ("kvbench_total_s", record.latency.total_s),
            ("kvbench_peak_bytes", record.memory.peak_bytes)]
        return record

    def check(self, record: Record) -> None:
        """Fail on a significant regression against the baseline (--kvbench-compare).

        The verdict goes into the item's record (once: the controller's summary reads it back)."""
        verdict = self.config.stash[GATE_KEY].judge(record)
        if verdict is None:
            return
        self.item.stash[VERDICT_KEY] = verdict.as_dict()
        if verdict.failed or verdict.status == "mismatch":
            pytest.fail(verdict.message, pytrace=False)


@pytest.fixture
def kvbench(request: pytest.FixtureRequest) -> KvbenchFixture:
    return KvbenchFixture(request.node)
