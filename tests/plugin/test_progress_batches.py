"""The progress line under batched decoding: what it says of a sample's members and the rate it projects
(fake clock and fake decode_batch values; no model runs)."""

import io

import pytest

from pytest_kvbench.wiring.progress.eta import GroupedEstimate, PlannedItem
from pytest_kvbench.wiring.progress.live import ItemProgress
from pytest_kvbench.wiring.progress.text import batch_note

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


@pytest.mark.parametrize("batches, note", [
    ((), None),  # the run decoded no member (a later item of its group)
    ((1,) * 33, "33 members decoded alone"),
    ((1,), "1 member decoded alone"),
    ((33,) * 33, "33 members decoded in one batch"),
    ((32,) * 64, "64 members decoded in 2 batches"),
    ((32,) * 32 + (1,), "32 members decoded in one batch, 1 alone"),
    ((20,) * 20 + (13,) * 13, "33 members decoded in 2 batches"),
])
def test_the_note_counts_members_and_batches_from_each_members_decode_batch(batches, note):
    assert batch_note(batches) == note


class Reporter:
    def __init__(self) -> None:
        self.out = io.StringIO()

    def isatty(self) -> bool:
        return False

    def write_line(self, line: str) -> None:
        self.out.write(line + "\n")


class Session:
    """The SessionProgress surface ItemProgress uses, with a fake clock and a log (plain lines)."""

    def __init__(self, planned) -> None:
        self.now = 0.0
        self.clock = lambda: self.now
        self.estimate = GroupedEstimate(planned)
        self.enabled, self.channel, self.interval, self.last_plain_line = True, None, 0.0, float("-inf")
        self.reporter = Reporter()

    def show(self, line: str, *, final: bool = False) -> None:
        self.reporter.write_line(line)

    def session_part(self, running, done, total) -> str:
        left = self.estimate.remaining(running.key, done, total, self.clock() - running.started)
        return f"left {left:.0f}"


class Case:
    id = key = "full-niah_single_1-ctx2048"


def test_a_log_line_says_the_batch_and_projects_the_batched_rate():
    """Sample 1 decodes 33 members alone (60 s), samples 2-5 decode them in one batch (10 s each)."""
    session = Session([PlannedItem(Case.key, "g", 5, 2048)])
    progress = ItemProgress(session, Case())
    session.now = 60.0
    progress(1, 5, (1,) * 33)
    for done in range(2, 6):
        session.now += 10.0
        progress(done, 5, (33,) * 33)
    lines = session.reporter.out.getvalue().splitlines()
    assert lines[0] == ("[kvbench] full-niah_single_1-ctx2048: 1/5 samples, 60.0 s/sample, item ETA 4m00s; "
                        "33 members decoded alone; left 240")
    assert lines[1] == ("[kvbench] full-niah_single_1-ctx2048: 2/5 samples, 10.0 s/sample, item ETA 30s; "
                        "33 members decoded in one batch; left 30")
    assert lines[-1].startswith("[kvbench] full-niah_single_1-ctx2048: 5/5 samples")


def test_an_item_whose_run_decoded_no_member_says_nothing_of_batches():
    session = Session([PlannedItem("a", "g", 2, 2048), PlannedItem(Case.key, "g", 2, 2048)])
    progress = ItemProgress(session, Case())
    session.now = 0.2
    progress(1, 2)
    assert session.reporter.out.getvalue() == ("[kvbench] full-niah_single_1-ctx2048: 1/2 samples, 0.2 s/sample, "
                                               "item ETA 0s; left 0\n")


def batch_across_three_samples() -> tuple[Session, ItemProgress]:
    """Sample 1 decodes 6 members alone (30 s); sample 2's run decodes the members of samples 2-4 in one batch
    (30 s: 10 s a sample). 5 samples in all."""
    session = Session([PlannedItem(Case.key, "g", 5, 2048)])
    progress = ItemProgress(session, Case())
    session.now = 30.0
    progress(1, 5, (1,) * 6, 1)
    session.now += 30.0
    progress(2, 5, (18,) * 18, 3)
    return session, progress


def test_a_batch_across_samples_is_projected_as_the_samples_it_decoded():
    """Sample 5 is left after the batch: 10 s, where reading the batch as one sample projected 3 x 30 s."""
    session, _ = batch_across_three_samples()
    assert session.reporter.out.getvalue().splitlines()[-1] == (
        "[kvbench] full-niah_single_1-ctx2048: 2/5 samples, 3.3 s/sample, item ETA 10s; "
        "18 members decoded in one batch; left 10")


def test_samples_counted_ahead_leave_the_samples_not_decoded_at_the_steady_rate():
    """Samples 3 and 4 (decoded in sample 2's batch) still take 6 s each (scoring and records): sample 5 is left
    at 10 s, not the projection less the time those took (-2 s)."""
    session, progress = batch_across_three_samples()
    for done in (3, 4):
        session.now += 6.0
        progress(done, 5)
    assert session.reporter.out.getvalue().splitlines()[-1].startswith(
        "[kvbench] full-niah_single_1-ctx2048: 4/5 samples, 10.0 s/sample, item ETA 10s")
