"""The regression gate: catches a broken method, ignores reruns and noise, never compares apples to pears."""

import json
import re
from dataclasses import replace

import numpy as np
import pytest
from test_cli_support import ENVIRONMENT, make_samples, typed
from test_cli_support import make_record as record_json

from pytest_kvbench.comparison.baseline_file import (
    Baseline,
    BaselineError,
    BaselineEntry,
    check_save_target,
    load_baseline,
    write_baseline,
)
from pytest_kvbench.comparison.tolerances import Tolerance, parse_tolerances
from pytest_kvbench.comparison.verdict_format import comparison_summary, comparison_table
from pytest_kvbench.comparison.verdicts import compare_record
from pytest_kvbench.results.run.environment import environment_differences
from pytest_kvbench.results.record import Record

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

DEFAULT = parse_tolerances([])


def make_record(*args, **kwargs) -> Record:
    return typed(record_json(*args, **kwargs))


def good_method_scores(n=120, seed=0):
    """Per-sample F1 of a working method: mostly right, some partial credit, some misses."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.choice([1.0, 1.0, 1.0, 0.5, 0.0], size=n) + rng.normal(0, 0.02, n), 0, 1).round(3)


def entry_for(scores, **kwargs):
    return BaselineEntry.of(make_record(list(scores), **kwargs))


# -- tolerances -------------------------------------------------------------------------------


def test_default_gates_the_score_one_sided_and_fidelity_two_sided():
    assert [str(t) for t in DEFAULT][0] == "score:1" and not DEFAULT.get("score").two_sided
    assert all(DEFAULT.get(metric).two_sided for metric in ("kl", "agreement", "decode_kl"))
    assert "latency" not in DEFAULT and "kv_bytes" not in DEFAULT


def test_tolerances_from_repeated_and_comma_separated_options():
    tolerances = parse_tolerances(["score:0.5, latency:20%", "kv_bytes:5%", "memory:1000000"])
    assert tolerances.get("score") == Tolerance("score", 0.5, False)
    assert tolerances.get("latency") == Tolerance("latency", 20.0, True)
    assert tolerances.get("kv_bytes").allowed(2_000_000) == pytest.approx(100_000)
    assert tolerances.get("peak_bytes") == Tolerance("peak_bytes", 1_000_000, False)


def test_score_gate_can_be_switched_off_or_made_relative():
    assert "score" not in parse_tolerances(["score:off", "latency:10%"])
    assert parse_tolerances(["score:2%"]).get("score").allowed(50.0) == pytest.approx(1.0)


@pytest.mark.parametrize("spec,message", [
    ("speed:10%", "METRIC one of score, latency"),
    ("kl:0.1:both", "optionally followed by :two-sided or :one-sided"),
    ("agreement:off:two-sided", "switched off has no side"),
    ("kl:-0.1", ">= 0"),
    ("decode_kl:inf", "finite"),
    ("agreement:", "expected METRIC:VALUE"),
    ("score", "expected METRIC:VALUE"),
    ("score:", "expected METRIC:VALUE"),
    ("latency:abc%", "expected METRIC:VALUE"),
    ("score:-1", ">= 0"),
    ("score:nan", "finite"),
])
def test_bad_tolerances_are_one_line_errors(spec, message):
    with pytest.raises(BaselineError, match=message) as info:
        parse_tolerances([spec])
    assert "\n" not in str(info.value)


def test_a_metric_given_twice_is_an_error():
    with pytest.raises(BaselineError, match="given twice"):
        parse_tolerances(["score:1", "score:2"])


# -- the gate (issue scenarios, unit level) ---------------------------------------------------


def test_a_deliberately_broken_method_is_caught():
    """Random positions under the name of a good method: most answers are lost."""
    good = good_method_scores()
    rng = np.random.default_rng(42)
    broken = np.where(rng.uniform(size=good.size) < 0.7, 0.0, good)
    verdict = compare_record(make_record(list(broken)), entry_for(good), DEFAULT)
    assert verdict.status == "regression" and verdict.failed
    score = verdict.checks[0]
    assert score.delta < -1 and score.high < 0 and score.p < 0.001
    for text in ("baseline", "current", "difference", "95% CI", "p=", "tolerance score:1"):
        assert text in verdict.message
    assert f"{score.baseline:.2f}" in verdict.message and f"{score.current:.2f}" in verdict.message


def test_an_identical_rerun_is_not_flagged():
    good = good_method_scores()
    verdict = compare_record(make_record(list(good)), entry_for(good), DEFAULT)
    assert verdict.status == "ok"
    assert verdict.checks[0].delta == 0 and verdict.checks[0].low == 0 and verdict.checks[0].high == 0


def test_a_change_inside_the_noise_is_not_flagged():
    """A few answers flip each way (sampling noise), net drop above the tolerance but not significant."""
    good = good_method_scores()
    noisy = good.copy()
    right = np.flatnonzero(good == 1.0)
    wrong = np.flatnonzero(good == 0.0)
    noisy[right[:6]] = 0.0
    noisy[wrong[:3]] = 1.0
    verdict = compare_record(make_record(list(noisy)), entry_for(good), DEFAULT)
    score = verdict.checks[0]
    assert score.delta < -1.0, "the drop must exceed the tolerance for this test to mean anything"
    assert score.high >= 0
    assert verdict.status == "ok" and "not significant" in score.note


def test_a_significant_drop_within_tolerance_is_not_flagged():
    good = good_method_scores()
    shaved = np.clip(good - 0.005, 0, 1)
    verdict = compare_record(make_record(list(shaved)), entry_for(good), DEFAULT)
    assert verdict.checks[0].high < 0 and verdict.checks[0].delta > -1.0
    assert verdict.status == "ok"
    assert compare_record(make_record(list(shaved)), entry_for(good), parse_tolerances(["score:0.1"])).failed


def test_a_significant_gain_is_reported_as_improved():
    good = good_method_scores()
    better = np.where(good == 0.0, 1.0, good)
    verdict = compare_record(make_record(list(better)), entry_for(good), DEFAULT)
    assert verdict.status == "improved" and not verdict.failed


def test_verdict_is_reproducible():
    good = good_method_scores()
    noisy = np.roll(good, 3)
    first = compare_record(make_record(list(noisy)), entry_for(good), DEFAULT, seed=5)
    again = compare_record(make_record(list(noisy)), entry_for(good), DEFAULT, seed=5)
    assert (first.checks[0].low, first.checks[0].high) == (again.checks[0].low, again.checks[0].high)


def test_samples_are_paired_by_id_not_by_position():
    good = good_method_scores(n=40)
    record = make_record(list(good))
    record = replace(record, samples=list(reversed(record.samples)))
    verdict = compare_record(record, entry_for(good), DEFAULT)
    assert verdict.status == "ok" and verdict.checks[0].delta == 0


# -- new, mismatch, unrun ---------------------------------------------------------------------


def test_an_item_missing_from_the_baseline_is_new_not_failed():
    verdict = compare_record(make_record([1, 1]), None, DEFAULT)
    assert verdict.status == "new" and not verdict.failed
    assert "not in the baseline" in verdict.message


def test_different_sample_ids_are_a_mismatch_not_a_comparison():
    entry = entry_for([1, 1, 1, 1])
    record = make_record(samples=make_samples([0, 0, 0, 0], prefix="other"))
    verdict = compare_record(record, entry, DEFAULT)
    assert verdict.status == "mismatch" and not verdict.failed
    assert "sample ids differ" in verdict.message and "only in the baseline" in verdict.message
    assert verdict.checks[0].delta is None


def test_different_method_parameters_or_protocol_are_a_mismatch():
    entry = entry_for([1, 0, 1])
    record = make_record([1, 0, 1], params={"window": 64, "kernel": 5}, protocol="query_agnostic")
    verdict = compare_record(record, entry, DEFAULT)
    assert verdict.status == "mismatch"
    assert "window: 32 -> 64" in verdict.message
    assert "protocol differs" in verdict.message
    assert verdict.row[-1].startswith("mismatch: method parameters differ; protocol differs")


def test_missing_per_sample_scores_are_a_mismatch_on_either_side():
    entry = entry_for([1, 0, 1])
    entry.samples[1]["score"] = None
    verdict = compare_record(make_record([1, 0, 1]), entry, DEFAULT)
    assert verdict.status == "mismatch" and "per-sample scores missing in the baseline" in verdict.message


def test_an_errored_item_is_a_mismatch_with_its_status():
    verdict = compare_record(make_record(status="error"), entry_for([1, 0]), DEFAULT)
    assert verdict.status == "mismatch" and "status error" in verdict.message


def test_unrun_baseline_entries_are_listed():
    baseline = Baseline.from_records([make_record(task="qasper"), make_record(task="hotpotqa")])
    assert baseline.unrun({"default|snapkv|128|qasper|seed0"}) == ["default|snapkv|128|hotpotqa|seed0"]
    summary = comparison_summary([], baseline.unrun(set()))
    assert "2 baseline entries not run" in summary and "not run: default|snapkv|128|qasper|seed0" in summary


def test_seeds_are_compared_pairwise_by_key():
    baseline = Baseline.from_records([make_record([1, 1, 0], seed=0), make_record([0, 0, 1], seed=1)])
    current = make_record([0, 0, 1], seed=1)
    assert baseline.entry(current).seed == 1
    assert compare_record(current, baseline.entry(current), DEFAULT).status == "ok"


# -- latency and memory -----------------------------------------------------------------------


def slow_samples(n, factor, seed=0):
    rng = np.random.default_rng(seed)
    pairs = [(40.0 * factor + rng.normal(0, 1), 60.0 * factor + rng.normal(0, 1)) for _ in range(n)]
    return make_samples([1.0] * n, latency_ms=pairs)


def test_latency_is_only_gated_when_asked():
    entry = BaselineEntry.of(make_record(samples=slow_samples(30, 1.0)))
    record = make_record(samples=slow_samples(30, 1.5, seed=1))
    assert compare_record(record, entry, DEFAULT).status == "ok"
    verdict = compare_record(record, entry, parse_tolerances(["latency:20%"]))
    assert verdict.status == "regression"
    latency = next(c for c in verdict.checks if c.metric == "latency")
    assert latency.low > 0 and latency.delta == pytest.approx(latency.current - latency.baseline)
    assert "latency baseline" in verdict.message
    assert re.search(r"\(\+(49|50)\.\d%\)", verdict.message), verdict.message


def test_latency_noise_is_not_flagged():
    entry = BaselineEntry.of(make_record(samples=slow_samples(30, 1.0)))
    record = make_record(samples=slow_samples(30, 1.02, seed=1))
    assert compare_record(record, entry, parse_tolerances(["latency:20%"])).status == "ok"


def test_kv_memory_growth_beyond_tolerance_fails():
    entry = entry_for([1, 1], kv_bytes=1_000_000)
    grown = make_record([1, 1], kv_bytes=1_100_000)
    tolerances = parse_tolerances(["kv_bytes:5%"])
    verdict = compare_record(grown, entry, tolerances)
    assert verdict.status == "regression" and "kv_bytes" in verdict.message
    assert compare_record(make_record([1, 1], kv_bytes=1_040_000), entry, tolerances).status == "ok"


def test_unmeasured_memory_is_shown_not_failed():
    entry = entry_for([1, 1], peak_bytes=None)
    verdict = compare_record(make_record([1, 1], peak_bytes=None), entry, parse_tolerances(["peak_bytes:1%"]))
    assert verdict.status == "ok"
    assert any(c.metric == "peak_bytes" and c.note == "not measured" for c in verdict.checks)


# -- the table ----------------------------------------------------------------------------------


def test_comparison_table_shows_baseline_current_delta_ci_p_and_verdict():
    good = good_method_scores(n=60)
    verdicts = [
        compare_record(make_record(list(good)), entry_for(good), DEFAULT),
        compare_record(make_record(list(good * 0), task="hotpotqa"), entry_for(good, task="hotpotqa"), DEFAULT),
        compare_record(make_record([1], task="narrativeqa"), None, DEFAULT),
    ]
    table = comparison_table(verdicts)
    header = table.splitlines()[0]
    for column in ("item", "baseline", "current", "delta", "95% CI", "p (t-test)", "verdict"):
        assert column in header
    lines = table.splitlines()
    assert any("qasper" in line and line.rstrip().endswith("ok") for line in lines)
    assert any("hotpotqa" in line and "regression" in line and "[-" in line for line in lines)
    assert any("narrativeqa" in line and line.rstrip().endswith("new") for line in lines)
    assert comparison_summary(verdicts).startswith("kvbench compare: 1 ok, 1 regression, 1 new")


# -- files ----------------------------------------------------------------------------------------


def test_baseline_round_trip_keeps_scores_samples_cost_and_environment(tmp_path):
    path = tmp_path / "baseline.json"
    records = [make_record([1, 0, 1]), make_record([0.5, 1], task="hotpotqa"), make_record(status="error", task="x")]
    write_baseline(path, records, ENVIRONMENT, force=False)
    baseline = load_baseline(path)
    assert sorted(baseline.entries) == ["default|snapkv|128|hotpotqa|seed0", "default|snapkv|128|qasper|seed0"]
    entry = baseline.entry(records[0])
    assert entry.score == records[0].score
    assert [s["score"] for s in entry.samples] == [1.0, 0.0, 1.0]
    assert entry.latency.total_s == records[0].latency.total_s
    assert entry.memory.kv_bytes_after == records[0].memory.kv_bytes_after
    assert baseline.environment == ENVIRONMENT and baseline.run_id == records[0].run_id
    assert compare_record(records[0], entry, DEFAULT).status == "ok"


def test_an_existing_baseline_is_never_overwritten_unless_forced(tmp_path):
    path = tmp_path / "baseline.json"
    path.write_text("precious")
    with pytest.raises(BaselineError, match="already exists; pass --kvbench-save-force"):
        write_baseline(path, [make_record()], ENVIRONMENT, force=False)
    assert path.read_text() == "precious"
    write_baseline(path, [make_record()], ENVIRONMENT, force=True)
    assert json.loads(path.read_text())["format"] == "kvbench-baseline"


def test_the_save_target_is_checked_before_the_run(tmp_path):
    check_save_target(tmp_path / "new.json", force=False)
    (tmp_path / "old.json").write_text("{}")
    with pytest.raises(BaselineError, match="already exists"):
        check_save_target(tmp_path / "old.json", force=False)
    check_save_target(tmp_path / "old.json", force=True)
    with pytest.raises(BaselineError, match="is a directory"):
        check_save_target(tmp_path, force=True)


def test_verdicts_serialise_for_records():
    good = good_method_scores(n=30)
    verdict = compare_record(make_record(list(good * 0)), entry_for(good), DEFAULT)
    data = json.loads(json.dumps(verdict.as_dict(), allow_nan=False))
    assert data["status"] == "regression" and data["checks"][0]["ci_high"] < 0
    assert data["checks"][0]["tolerance"] == "score:1"


def test_a_baseline_needs_a_scored_item(tmp_path):
    with pytest.raises(BaselineError, match="no item produced a score"):
        write_baseline(tmp_path / "b.json", [make_record(status="skipped")], ENVIRONMENT, force=False)
    assert not (tmp_path / "b.json").exists()


def test_duplicate_keys_cannot_make_a_baseline():
    with pytest.raises(BaselineError, match="appears twice"):
        Baseline.from_records([make_record(), make_record()])


def _valid_baseline(tmp_path):
    path = tmp_path / "baseline.json"
    write_baseline(path, [make_record()], ENVIRONMENT, force=False)
    return path, json.loads(path.read_text())


@pytest.mark.parametrize("mutate,message", [
    (lambda d: "{ not json", "invalid JSON at line 1 column 3"),
    (lambda d: [1, 2], "not a kvbench baseline"),
    (lambda d: d | {"format": "pytest-benchmark"}, "not a kvbench baseline"),
    (lambda d: d | {"version": 99}, "format version 99"),
    (lambda d: d | {"entries": []}, "'entries' must be an object"),
    (lambda d: d | {"entries": {"k": {"score": "high", "samples": []}}}, "entry 'k' has no numeric 'score'"),
    (lambda d: d | {"entries": {"k": {"score": 1.0}}}, "entry 'k' has no 'samples' list"),
    (lambda d: d | {"entries": {"k": {"score": 1.0, "samples": [{"id": "a"}]}}}, "sample 'a' has no numeric 'score'"),
    (lambda d: d | {"entries": {"k": {"score": 1.0, "samples": [{"score": 1}]}}}, "sample 1 has no 'id'"),
])
def test_malformed_baselines_are_named_one_line_errors(tmp_path, mutate, message):
    path, data = _valid_baseline(tmp_path)
    changed = mutate(data)
    path.write_text(changed if isinstance(changed, str) else json.dumps(changed))
    with pytest.raises(BaselineError, match=message) as info:
        load_baseline(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_missing_directory_and_binary_baselines_are_named_errors(tmp_path):
    with pytest.raises(BaselineError, match="does not exist"):
        load_baseline(tmp_path / "nope.json")
    with pytest.raises(BaselineError, match="is a directory"):
        load_baseline(tmp_path)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(BaselineError, match="not UTF-8"):
        load_baseline(binary)


def test_environment_differences_name_what_changed():
    changed = ENVIRONMENT | {"git_commit": "abc", "versions": ENVIRONMENT["versions"] | {"torch": "2.14.0"}}
    notes = environment_differences(ENVIRONMENT, changed)
    assert any(n.startswith("git_commit:") for n in notes)
    assert "torch: 2.13.0 -> 2.14.0" in notes
    assert environment_differences(ENVIRONMENT, ENVIRONMENT) == []
