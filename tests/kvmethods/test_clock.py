"""Timings on a GPU are the device's time: every clock read of the runtime waits for queued CUDA work.

There is no GPU here, so CUDA is faked: `torch.cuda.is_initialized` says yes and `synchronize` logs
itself, as does the clock. A prefill+decode and a shared prefill must read the clock only right after a
synchronize; and no module of the runtime may read `time.perf_counter` behind the clock's back.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from kvmethods import Budget, get_method
from kvmethods.core import clock
from kvmethods.runtime.generation import generate
from kvmethods.runtime.shared_prefill import shared_prefill
from model_helpers import one_thread  # noqa: F401 (a module-scoped autouse fixture: applies here)
from kvmethods.testing import tiny_model

ROOT = Path(__file__).resolve().parents[2]
TIMED_PACKAGES = [ROOT / "kvmethods", ROOT / "pytest_kvbench" / "engine"]


@pytest.fixture
def fake_cuda(monkeypatch):
    """CUDA in use: each synchronize and each clock read is logged, in order."""
    events: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: events.append("sync"))
    real = clock.time.perf_counter
    monkeypatch.setattr(clock.time, "perf_counter", lambda: events.append("clock") or real())
    return events


def _assert_every_read_waits(events: list[str]) -> None:
    assert events.count("clock") >= 4
    for i, event in enumerate(events):
        if event == "clock":
            assert i > 0 and events[i - 1] == "sync", f"clock read #{i} without a synchronize before it: {events}"


def test_prefill_scoring_and_decode_are_timed_after_the_device_finished(fake_cuda):
    model = tiny_model("llama", seed=1)
    prompt = list(range(5, 69))
    for name in ("snapkv", "kvzip"):  # a layer-wise selection, and a whole-prompt scorer (scoring_s)
        out = generate(model, get_method(name), "16", prompt, len(prompt), 4, set(), "question_in_window")
        assert out.prefill_s > 0 and out.decode_s > 0
    _assert_every_read_waits(fake_cuda)


def test_a_shared_prefill_times_its_forward_and_selections_after_the_device_finished(fake_cuda):
    model = tiny_model("llama", seed=1)
    prompt = list(range(5, 69))
    requests = [(get_method("snapkv"), Budget.parse("16")), (get_method("h2o"), Budget.parse("24"))]
    shared_prefill(model, requests, prompt, len(prompt), "question_in_window", len(prompt) + 4)
    _assert_every_read_waits(fake_cuda)


def test_on_the_cpu_the_clock_never_synchronizes(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: pytest.fail("synchronize without CUDA"))
    assert clock.now() <= clock.now()


def _reads_perf_counter(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr == "perf_counter":
            return True
    return False


def test_the_runtime_reads_time_only_through_the_clock():
    offenders = [str(path.relative_to(ROOT)) for package in TIMED_PACKAGES for path in sorted(package.rglob("*.py"))
                 if path.name != "clock.py" and _reads_perf_counter(path)]
    # engine/models.py times a model load (from_pretrained is synchronous; a load is not a kernel timing)
    assert offenders == ["pytest_kvbench/engine/models.py"]
