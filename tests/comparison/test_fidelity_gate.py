"""Fidelity gating: KL, agreement and the decode's KL paired per sample, two-sided, on by default; the score's
two-sided option; a baseline without fidelity figures gates on the score alone and says so."""

import numpy as np
import pytest
from test_cli_support import make_record as record_json
from test_cli_support import make_samples, typed

from pytest_kvbench.comparison.baseline_file import Baseline, BaselineEntry, load_baseline, write_baseline
from pytest_kvbench.comparison.tolerances import parse_tolerances
from pytest_kvbench.comparison.verdict_format import comparison_table, score_alone_note
from pytest_kvbench.comparison.verdicts import compare_record

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

DEFAULT = parse_tolerances([])
N = 20


def fidelity_record(kl, agreement=None, decode_kl=None, scores=None):
    """A record whose samples carry the given per-sample fidelity figures."""
    scores = [1.0] * len(kl) if scores is None else scores
    samples = make_samples(scores)
    for index, sample in enumerate(samples):
        sample["kl"] = float(kl[index])
        sample["agreement"] = float(agreement[index]) if agreement is not None else 0.9
        sample["decode_kl"] = float(decode_kl[index]) if decode_kl is not None else float(kl[index])
    return typed(record_json(scores, samples=samples))


def base_kl(seed=0):
    return np.random.default_rng(seed).uniform(0.5, 3.0, N)


def check(verdict, metric):
    return next(c for c in verdict.checks if c.metric == metric)


@pytest.mark.parametrize("metric,shift,direction", [
    ("kl", +0.3, "kl higher (further from the full cache)"),
    ("kl", -0.3, "kl lower (closer to the full cache: the method changed)"),
    ("decode_kl", +0.3, "decode_kl higher (further from the full cache)"),
    ("agreement", -0.1, "agreement lower (further from the full cache)"),
    ("agreement", +0.05, "agreement higher (closer to the full cache"),
])
def test_a_significant_fidelity_move_either_way_fails_and_names_its_direction(metric, shift, direction):
    kl, agreement = base_kl(), np.full(N, 0.8)
    moved = {"kl": kl.copy(), "agreement": agreement.copy(), "decode_kl": kl.copy()}
    moved[metric] = moved[metric] + shift + np.random.default_rng(1).normal(0, 0.01, N)
    baseline = BaselineEntry.of(fidelity_record(kl, agreement))
    verdict = compare_record(fidelity_record(moved["kl"], moved["agreement"], moved["decode_kl"]), baseline, DEFAULT)
    assert verdict.failed, verdict.message
    assert verdict.status == ("regression" if "further" in direction else "changed")
    assert direction in verdict.message and "--kvbench-save" in verdict.message
    assert check(verdict, "score").status == "ok"  # the score alone would have passed


def test_fidelity_noise_below_the_tolerance_passes_and_an_identical_rerun_is_exact():
    kl = base_kl()
    baseline = BaselineEntry.of(fidelity_record(kl))
    same = compare_record(fidelity_record(kl), baseline, DEFAULT)
    assert same.status == "ok" and check(same, "kl").delta == 0 and check(same, "kl").high == 0
    jitter = np.random.default_rng(3).normal(0, 1e-4, N)  # thread-count noise is far below this (docs/baselines.md)
    noisy = compare_record(fidelity_record(kl + 1e-4 + jitter), baseline, DEFAULT)
    assert noisy.status == "ok" and check(noisy, "kl").status == "ok"


def test_fidelity_gating_can_be_switched_off_or_made_one_sided():
    kl = base_kl()
    baseline = BaselineEntry.of(fidelity_record(kl))
    better = fidelity_record(kl - 0.3, decode_kl=kl - 0.3)
    assert compare_record(better, baseline, DEFAULT).status == "changed"
    one_sided = parse_tolerances(["kl:0.01:one-sided", "decode_kl:0.01:one-sided"])
    judged = compare_record(better, baseline, one_sided)
    assert judged.status == "ok" and check(judged, "kl").status == "improved"
    off = compare_record(better, baseline, parse_tolerances(["kl:off", "decode_kl:off"]))
    assert off.status == "ok" and check(off, "kl").note == "not gated"
    assert str(one_sided.get("kl")) == "kl:0.01:one-sided" and str(DEFAULT.get("kl")) == "kl:0.01"


def test_the_score_is_one_sided_unless_asked():
    before, after = [0.0] * 10 + [1.0] * 10, [1.0] * 20
    kl = base_kl()
    baseline = BaselineEntry.of(fidelity_record(kl, scores=before))
    current = fidelity_record(kl, scores=after)
    assert compare_record(current, baseline, DEFAULT).status == "improved"
    two_sided = compare_record(current, baseline, parse_tolerances(["score:1:two-sided"]))
    assert two_sided.failed and "score rose (two-sided)" in two_sided.message
    assert str(parse_tolerances(["score:1:two-sided"]).get("score")) == "score:1:two-sided"


def test_fidelity_is_paired_by_sample_id():
    kl = base_kl()
    baseline = BaselineEntry.of(fidelity_record(kl))
    shuffled = fidelity_record(kl)
    shuffled.samples.reverse()  # the same figures per id, in another order
    assert compare_record(shuffled, baseline, DEFAULT).status == "ok"


def test_a_baseline_without_fidelity_gates_on_the_score_alone_and_says_so(tmp_path):
    kl = base_kl()
    old = fidelity_record(kl)
    for sample in old.samples:
        for name in ("kl", "agreement", "decode_kl"):
            sample.pop(name)
    path = tmp_path / "old.json"
    write_baseline(path, [old], {}, force=False)
    baseline = load_baseline(path)
    assert not baseline.has_fidelity
    note = score_alone_note(baseline, DEFAULT)
    assert "no per-sample fidelity figures" in note and "score alone" in note and "\n" not in note
    verdict = compare_record(fidelity_record(kl + 5), baseline.entry(old), DEFAULT)
    assert verdict.status == "ok" and [c.metric for c in verdict.checks] == ["score"]
    assert score_alone_note(baseline, parse_tolerances(["kl:off", "agreement:off", "decode_kl:off"])) is None
    with_fidelity = Baseline.from_records([fidelity_record(kl)])
    assert with_fidelity.has_fidelity and score_alone_note(with_fidelity, DEFAULT) is None


def test_a_baseline_keeps_per_sample_fidelity(tmp_path):
    kl = base_kl()
    record = fidelity_record(kl, decode_kl=kl * 2)
    write_baseline(tmp_path / "b.json", [record], {}, force=False)
    entry = load_baseline(tmp_path / "b.json").entry(record)
    assert [s["decode_kl"] for s in entry.samples] == pytest.approx(list(kl * 2))
    assert [s["kl"] for s in entry.samples] == pytest.approx(list(kl))


def test_the_table_shows_fidelity_verdicts():
    kl = base_kl()
    verdict = compare_record(fidelity_record(kl + 0.5), BaselineEntry.of(fidelity_record(kl)), DEFAULT)
    table = comparison_table([verdict])
    assert "decode_kl" in table and "regression" in table


def test_fidelity_figures_print_as_numbers_not_bytes():
    from pytest_kvbench.comparison.verdict_format import fmt_delta, fmt_value

    assert fmt_value("decode_kl", 0.5) == "0.5000" and fmt_delta("kl", 0.25) == "+0.2500"
