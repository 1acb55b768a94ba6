"""The gate compares the benchmark's fingerprint before the scores (issue 50, part 1).

A baseline from before a prompt, settings or metric change fails with "benchmark changed: <what> of <task>"
and how to accept it, instead of a score verdict; the full-cache reference is held to its baseline's outputs
exactly where the run is deterministic (CPU, same torch, CPU model and threads); a baseline saved before
fingerprints still gates, and says once that it cannot see such changes.
"""

from __future__ import annotations

import copy

import pytest
from test_cli_support import make_record, make_samples, typed

from pytest_kvbench.comparison.baseline_file import Baseline, load_baseline, write_baseline
from pytest_kvbench.comparison.benchmark_changes import without_fingerprint_note
from pytest_kvbench.comparison.tolerances import parse_tolerances
from pytest_kvbench.comparison.verdict_format import comparison_summary
from pytest_kvbench.comparison.verdicts import compare_record
from pytest_kvbench.results.record import Record
from pytest_kvbench.results.record.fingerprint import STOP_RULE, token_digest

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

DEFAULT = parse_tolerances([])
SCORES = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]
CPU = {"type": "cpu", "cpu_model": "Xeon", "torch": "2.13.0+cpu", "threads": 1}


def fingerprinted(budget="128", method="snapkv", prompts=range(6), outputs=range(6), max_new_tokens=32, version=1,
                  metric="f1", device=None, params=None) -> Record:
    samples = make_samples(SCORES, prefix="qasper")
    for sample, prompt, output in zip(samples, prompts, outputs):
        sample["prompt_digest"] = token_digest([prompt, 7, 7])
        sample["output_digest"] = token_digest([output])
    record = make_record(SCORES, samples=samples, budget=budget, method=method, metric=metric, params=params)
    record["benchmark"] = {"task_version": version, "metric": metric,
                           "settings": {"max_new_tokens": max_new_tokens, "stop": STOP_RULE, "eos_token_ids": [1],
                                        "chat_template": None}}
    record["device"] = dict(CPU if device is None else device)
    return typed(record)


def verdict_against(baseline_record: Record, record: Record):
    return compare_record(record, Baseline.from_records([baseline_record]).entry(record), DEFAULT)


def test_the_same_benchmark_is_compared_on_its_scores():
    assert verdict_against(fingerprinted(), fingerprinted()).status == "ok"


def test_a_prompt_change_fails_as_a_changed_benchmark_not_a_score_verdict():
    verdict = verdict_against(fingerprinted(), fingerprinted(prompts=[0, 1, 2, 30, 4, 50]))
    assert verdict.status == "benchmark" and verdict.failed
    assert "benchmark changed: prompt of qasper (2 of 6 samples' prompt tokens differ)" in verdict.message
    assert "--kvbench-save" in verdict.message and [c.metric for c in verdict.checks] == ["score"]
    assert "benchmark changed default|snapkv|128|qasper|seed0: prompt of qasper" in comparison_summary([verdict])


@pytest.mark.parametrize("changed, expected", [
    (dict(max_new_tokens=31), "settings of qasper (max_new_tokens 32 -> 31)"),
    (dict(version=2), "metric version of qasper (f1 v1 -> f1 v2)"),
    (dict(metric="rouge"), "metric version of qasper (f1 v1 -> rouge v1)"),
])
def test_settings_and_metric_changes_name_what_changed(changed, expected):
    verdict = verdict_against(fingerprinted(), fingerprinted(**changed))
    assert verdict.status == "benchmark" and verdict.reasons == [expected], verdict.message


def test_the_reference_output_is_held_exactly_where_the_run_is_deterministic():
    moved = [0, 1, 2, 3, 4, 99]
    verdict = verdict_against(fingerprinted(budget="full", method="full"), fingerprinted("full", "full", outputs=moved))
    assert verdict.status == "benchmark"
    assert "reference output of qasper (1 of 6 samples' full-cache output tokens differ" in verdict.message
    gpu = {"type": "cuda", "name": "H100", "torch": "2.13.0"}
    on_gpu = verdict_against(fingerprinted("full", "full", device=gpu), fingerprinted("full", "full", outputs=moved,
                                                                                        device=gpu))
    assert on_gpu.status == "ok"  # rounding on a GPU may move a greedy token: not held exactly there
    other_torch = dict(CPU, torch="2.12.0+cpu")
    assert verdict_against(fingerprinted("full", "full"), fingerprinted("full", "full", outputs=moved,
                                                                       device=other_torch)).status == "ok"
    # a compressed method's own outputs are its result, judged by the scores and fidelity, not held exactly
    assert verdict_against(fingerprinted(), fingerprinted(outputs=moved)).status == "ok"


def test_a_reference_history_that_changed_length_is_a_changed_benchmark():
    """Multi-turn: a sample's prompt counts the earlier questions and answers the model saw. Dropping a token of
    each earlier answer from the history moves neither the prompt digest (the turn's own question) nor, on a
    small model, the reference's answers; the length of what the reference was shown does move."""
    baseline, shorter = fingerprinted("full", "full"), fingerprinted("full", "full")
    for turn, (before, after) in enumerate(zip(baseline.samples, shorter.samples)):
        before["prompt_tokens"], after["prompt_tokens"] = 1000 + 40 * turn, 1000 + 39 * turn
    verdict = verdict_against(baseline, shorter)
    assert verdict.status == "benchmark"
    assert verdict.reasons == ["history of qasper (5 of 6 samples' full-cache prompts, earlier turns included, "
                               "differ in length with the same prompt, on the same CPU and torch)"]
    assert verdict_against(baseline, baseline).status == "ok"
    older = fingerprinted("full", "full")  # a baseline saved before prompt_tokens were kept: nothing to pair
    for sample in older.samples:
        del sample["prompt_tokens"]
    assert verdict_against(older, shorter).status == "ok"
    reworded = fingerprinted("full", "full", prompts=[0, 1, 2, 3, 4, 50])
    reworded.samples[5]["prompt_tokens"] = 1199
    assert [r.split(" (")[0] for r in verdict_against(baseline, reworded).reasons] == ["prompt of qasper"]


def test_the_same_reference_output_scored_differently_is_a_changed_metric():
    """A metric read as match-any instead of match-all raises the reference and every method alike: the score
    gate is one-sided and fidelity cancels it out, but the full cache's unchanged outputs now score differently."""
    baseline = fingerprinted("full", "full")
    rescored = fingerprinted("full", "full")
    for sample in rescored.samples[:4]:
        sample["score"] = 1.0  # two samples that scored 0 now score 1, from the same output tokens
    verdict = verdict_against(baseline, rescored)
    assert verdict.status == "benchmark"
    assert verdict.reasons == ["scoring of qasper (1 of 6 samples' unchanged full-cache outputs score differently: "
                               "the metric changed)"]
    moved = fingerprinted("full", "full", outputs=[0, 99, 2, 3, 4, 5])
    moved.samples[1]["score"] = 1.0  # a new output may score anything: that is the output check's to say
    assert "scoring of" not in verdict_against(baseline, moved).message
    gpu = {"type": "cuda", "name": "H100", "torch": "2.13.0"}
    assert verdict_against(fingerprinted("full", "full", device=gpu), fingerprinted("full", "full", device=gpu)
                           ).status == "ok"


def test_a_seeded_methods_output_is_held_exactly_where_the_run_is_deterministic():
    """`random` drawing from the global RNG instead of its seeded generator keeps the same kind of random choice:
    its scores and fidelity move both ways and pass; its outputs for the same seed are what changed."""
    moved = [0, 1, 2, 3, 99, 5]
    verdict = verdict_against(fingerprinted(method="random", params={"seed": 0}),
                              fingerprinted(method="random", params={"seed": 0}, outputs=moved))
    assert verdict.status == "benchmark"
    assert verdict.reasons == ["seeded output of random on qasper (1 of 6 samples' output tokens differ for the "
                               "same seed, on the same CPU and torch)"]
    gpu = {"type": "cuda", "name": "H100", "torch": "2.13.0"}
    assert verdict_against(fingerprinted(method="random", params={"seed": 0}, device=gpu),
                           fingerprinted(method="random", params={"seed": 0}, outputs=moved, device=gpu)
                           ).status == "ok"


def test_every_methods_fidelity_is_held_to_rounding_where_the_run_is_deterministic():
    """Expected Attention's future queries rotated the wrong way round lowered KL on every sample, far below the
    statistical tolerance, and left the outputs as they were. On the same CPU and torch a sample's KL is a function
    of the code, so a move past rounding (decoding alone instead of batched: up to 3.6e-5) fails as a changed
    method; rounding passes, a metric set off or one-sided is left to the user's choice, and elsewhere (a GPU)
    only the statistics judge."""
    baseline = fingerprinted(method="expected_attention")
    rounded = fingerprinted(method="expected_attention")
    for sample in rounded.samples:
        sample["kl"] += 4e-5
    assert verdict_against(baseline, rounded).status == "ok"
    rotated = fingerprinted(method="expected_attention")
    rotated.samples[3]["kl"] -= 0.004
    rotated.samples[5]["kl"] -= 0.0012
    verdict = verdict_against(baseline, rotated)
    assert verdict.status == "changed" and verdict.failed
    (kl,) = [check for check in verdict.checks if check.status == "changed"]
    assert kl.metric == "kl" and kl.note.startswith("2 of 6 samples moved past float rounding on the same CPU")
    assert "changed against the baseline: kl lower (closer to the full cache: the method changed)" in verdict.message
    assert "beyond the tolerance kl: 0.0001 of each sample's value (a deterministic run)" in verdict.message
    worse = fingerprinted(method="expected_attention")
    worse.samples[0]["kl"] += 0.002
    assert "kl higher (further from the full cache)" in verdict_against(baseline, worse).message
    large = fingerprinted(method="expected_attention")
    for sample, value in zip(large.samples, [16.0, 16.1, 16.2, 16.3, 16.4, 16.5]):
        sample["kl"] = value
    nudged = copy.deepcopy(large)
    nudged.samples[0]["kl"] += 0.0015  # within 1e-4 of a KL of 16
    assert verdict_against(large, nudged).status == "ok"
    for off in ("kl:off", "kl:0.05:one-sided"):
        assert compare_record(rotated, Baseline.from_records([baseline]).entry(rotated),
                              parse_tolerances([off])).status == "ok"
    gpu = {"type": "cuda", "name": "H100", "torch": "2.13.0"}
    on_gpu = fingerprinted(method="expected_attention", device=gpu)
    moved = fingerprinted(method="expected_attention", device=gpu)
    moved.samples[3]["kl"] -= 0.004
    assert verdict_against(on_gpu, moved).status == "ok"


def test_a_baseline_saved_before_fingerprints_still_gates_and_says_so_once(tmp_path):
    old = fingerprinted()
    old_json = old.to_json()
    old_json.pop("benchmark")
    for sample in old_json["samples"]:
        sample.pop("prompt_digest"), sample.pop("output_digest")
    old_json["schema_version"] = 2
    path = tmp_path / "old.json"
    write_baseline(path, [Record.from_json(copy.deepcopy(old_json))], {}, force=False)
    baseline = load_baseline(path)
    note = without_fingerprint_note(baseline)
    assert "no benchmark fingerprints" in note and "--kvbench-save" in note and "\n" not in note
    verdict = compare_record(fingerprinted(prompts=[9] * 6), baseline.entry(old), DEFAULT)
    assert verdict.status == "ok"  # gated on its scores: the prompt change cannot be seen
    assert without_fingerprint_note(Baseline.from_records([fingerprinted()])) is None


def test_a_saved_baseline_keeps_the_fingerprint(tmp_path):
    path = tmp_path / "b.json"
    write_baseline(path, [fingerprinted()], {}, force=False)
    entry = next(iter(load_baseline(path).entries.values()))
    assert entry.benchmark["settings"]["max_new_tokens"] == 32
    assert entry.samples[0]["prompt_digest"] == token_digest([0, 7, 7])
    assert entry.samples[0]["output_digest"] == token_digest([0])


def test_a_version_2_record_reads_with_no_fingerprint():
    record = fingerprinted().to_json()
    record.pop("benchmark")
    record["schema_version"] = 2
    migrated = Record.from_json(record)
    assert migrated.benchmark is None and migrated.schema_version == 3
