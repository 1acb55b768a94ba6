"""Each gate entry's power: the smallest score drop the gate fails (found with the gate's own statistics), the
fidelity metrics that can fail it, and a one-line warning naming the entries that cannot fail at all."""

import pytest
from test_cli_support import make_record as record_json
from test_cli_support import make_samples, typed

from pytest_kvbench.comparison.baseline_file import BaselineEntry
from pytest_kvbench.comparison.power import cannot_fail_warning, entry_power, gate_powers, power_table
from pytest_kvbench.comparison.tolerances import parse_tolerances
from pytest_kvbench.comparison.verdicts import compare_record

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

DEFAULT = parse_tolerances([])


def entry(scores, kl=None, budget="128", task="qasper"):
    samples = make_samples(scores, prefix=task)
    for index, sample in enumerate(samples):
        sample["kl"] = kl[index] if kl is not None else 0.0
        sample["agreement"] = 1.0 if kl is None or kl[index] == 0 else 0.5
        sample["decode_kl"] = sample["kl"]
    return BaselineEntry.of(typed(record_json(scores, samples=samples, budget=budget, task=task)))


def test_the_smallest_drop_is_the_one_the_gate_itself_fails_at():
    scores = [1.0] * 20
    power = entry_power(entry(scores), DEFAULT)
    lost = round(power.score_drop / 5)  # each lost answer of 20 is 5 points
    assert 1 < lost < 20 and power.score_drop == lost * 5.0
    off = parse_tolerances(["kl:off", "agreement:off", "decode_kl:off"])
    base = entry(scores)
    just = [0.0] * lost + [1.0] * (20 - lost)
    short = [0.0] * (lost - 1) + [1.0] * (20 - lost + 1)
    assert compare_record(typed(record_json(just)), base, off).failed
    assert not compare_record(typed(record_json(short)), base, off).failed


def test_few_samples_detect_only_large_drops():
    assert entry_power(entry([1.0] * 4), DEFAULT).score_drop is None or \
        entry_power(entry([1.0] * 4), DEFAULT).score_drop >= 75
    assert entry_power(entry([1.0] * 40), DEFAULT).score_drop < entry_power(entry([1.0] * 10), DEFAULT).score_drop


def test_fidelity_gives_power_where_the_score_is_flat():
    flat = entry([0.0] * 8, kl=[1.0 + 0.1 * i for i in range(8)])
    power = entry_power(flat, DEFAULT)
    assert power.score_drop is None and "scores 0" in power.score_why
    assert power.fidelity == ("kl", "agreement", "decode_kl") and power.can_fail


def test_entries_that_cannot_fail_are_named_in_one_line():
    dead_full = entry([0.0] * 3, budget="full", task="passkey")
    one = entry([1.0], kl=[2.0], task="aime")
    same_as_full = entry([0.0] * 3, task="scbench")  # kl 0, agreement 1 everywhere: nothing moved
    alive = entry([0.0] * 5, kl=[1.0, 2.0, 3.0, 4.0, 5.0], task="niah")
    powers = gate_powers([dead_full, one, same_as_full, alive], DEFAULT)
    assert [p.can_fail for p in powers] == [False, True, False, False]  # by key: 128|aime, niah, scbench, full|passkey
    warning = cannot_fail_warning(powers)
    assert warning.startswith("warning: 3 of 4 gate entries cannot fail") and "\n" not in warning
    assert "one sample" in warning and "the full cache itself" in warning and "equal to the full cache" in warning
    assert cannot_fail_warning([p for p in powers if p.can_fail]) is None
    table = power_table(powers)
    assert "smallest score drop detected" in table and "kl, agreement, decode_kl" in table


def test_switching_the_score_off_leaves_fidelity():
    power = entry_power(entry([1.0] * 10, kl=[1.0] * 10), parse_tolerances(["score:off"]))
    assert power.score_drop is None and power.score_why == "score not gated" and power.can_fail
