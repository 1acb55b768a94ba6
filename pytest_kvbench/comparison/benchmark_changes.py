"""Whether a record and its baseline entry measured the same benchmark, checked before their scores are compared.

A change that moves the full-cache reference and every method alike (a prompt template, a stop rule, a metric)
cancels out of fidelity and barely moves scores, so a baseline from before it would be compared as if it were
the same benchmark. The record's fingerprint (results/record/fingerprint.py) names what was measured; here it is
compared with the entry's, in the order a user can act on: the prompts (per sample, by id), the generation
settings, the metric and its task's version, and, where the run is deterministic, the full-cache reference's
history (a multi-turn sample's prompt counts the earlier turns the model saw), its own output and its scores (the same output scored differently: the metric changed), and a seeded method's output. Each difference is one phrase naming what changed; the gate fails on any.

Deterministic means on CPU with the same torch, CPU model and thread count as the baseline: there the
full-cache reference is bitwise reproducible, so it is held to its baseline's outputs exactly, not within a
noise tolerance. Elsewhere (a GPU, another torch) its outputs may differ by rounding, and only the rest is checked.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvmethods import FULL_CACHE
from pytest_kvbench.results.record import Record
from pytest_kvbench.results.record.fingerprint import OUTPUTS_ON

SCORE_EPSILON = 1e-9  # a score read back from JSON is the same float; this only absorbs a sum's last bit

if TYPE_CHECKING:
    from pytest_kvbench.comparison.baseline_file import BaselineEntry


def _by_id(samples: list[dict], name: str) -> dict[str, str]:
    return {str(sample.get("id")): sample[name] for sample in samples if sample.get(name) is not None}


def _differing(record: Record, entry: BaselineEntry, name: str) -> tuple[int, int]:
    """(samples whose digest differs, samples with a digest on both sides), paired by sample id."""
    ours, theirs = _by_id(record.samples, name), _by_id(entry.samples, name)
    shared = ours.keys() & theirs.keys()
    return sum(ours[i] != theirs[i] for i in shared), len(shared)


def is_seeded(record: Record) -> bool:
    """A method whose choices come from its own seed (`random`, `leverage`'s sketch: a `seed` parameter). Drawing
    from another stream (the global RNG) changes its outputs without a statistical trace: one random choice is as
    good as another, so scores and fidelity move both ways and the gate cannot see it. Where the run is
    deterministic its outputs are therefore held exactly, as the reference's are."""
    return record.method is not None and "seed" in (record.method.params or {})


def is_deterministic(record: Record, entry: BaselineEntry) -> bool:
    """Both on CPU, with the same torch, CPU model and threads: the same inputs give bitwise the same outputs.
    The entry's side is where its output digests were computed (``outputs_on``; its device otherwise)."""
    ours = {name: getattr(record.device, name) for name in OUTPUTS_ON}
    theirs = (entry.benchmark or {}).get("outputs_on") or {name: getattr(entry.device, name) for name in OUTPUTS_ON}
    return ours["type"] == "cpu" and ours["torch"] is not None and all(ours[n] == theirs.get(n) for n in OUTPUTS_ON)


def _settings_changes(ours: dict, theirs: dict) -> str | None:
    names = sorted(set(ours) | set(theirs))
    moved = [f"{name} {theirs.get(name)!r} -> {ours.get(name)!r}" for name in names if ours.get(name) != theirs.get(name)]
    return ", ".join(moved) or None


def benchmark_changes(record: Record, entry: BaselineEntry) -> list[str] | None:
    """What of the benchmark changed between the entry and the record, one phrase each (empty: the same
    benchmark); None when the entry (or the record) has no fingerprint, so nothing can be told."""
    theirs, ours = entry.benchmark, record.benchmark
    if not isinstance(theirs, dict) or not isinstance(ours, dict):
        return None
    task, changes = record.task.name, []
    differing, paired = _differing(record, entry, "prompt_digest")
    if differing:
        changes.append(f"prompt of {task} ({differing} of {paired} samples' prompt tokens differ)")
    settings = _settings_changes(ours.get("settings") or {}, theirs.get("settings") or {})
    if settings:
        changes.append(f"settings of {task} ({settings})")
    if (ours.get("metric"), ours.get("task_version")) != (theirs.get("metric"), theirs.get("task_version")):
        changes.append(f"metric version of {task} ({theirs.get('metric')} v{theirs.get('task_version')} -> "
                       f"{ours.get('metric')} v{ours.get('task_version')})")
    if is_seeded(record) and is_deterministic(record, entry):
        differing, paired = _differing(record, entry, "output_digest")
        if differing:
            changes.append(f"seeded output of {record.method.name} on {task} ({differing} of {paired} samples' "
                           f"output tokens differ for the same seed, on the same CPU and torch)")
    if record.budget.spec == FULL_CACHE.spec and is_deterministic(record, entry):
        differing, paired = _differing(record, entry, "prompt_tokens")
        if differing and not changes:  # a changed prompt changes its length too: said above
            changes.append(f"history of {task} ({differing} of {paired} samples' full-cache prompts, earlier turns "
                           f"included, differ in length with the same prompt, on the same CPU and torch)")
        differing, paired = _differing(record, entry, "output_digest")
        if differing:
            changes.append(f"reference output of {task} ({differing} of {paired} samples' full-cache output "
                           f"tokens differ, on the same CPU and torch)")
        rescored, same = _rescored(record, entry)
        if rescored:
            changes.append(f"scoring of {task} ({rescored} of {same} samples' unchanged full-cache outputs score "
                           f"differently: the metric changed)")
    return changes


def _rescored(record: Record, entry: BaselineEntry) -> tuple[int, int]:
    """(samples whose score differs, samples with the same output digest on both sides): the metric is a function
    of the output, so the same output scoring differently means the scoring changed (RULER's string_match_all read
    as match-any raises the reference and the methods alike, and a one-sided score gate never sees a rise)."""
    ours, theirs = _by_id(record.samples, "output_digest"), _by_id(entry.samples, "output_digest")
    scores, baseline_scores = _by_id(record.samples, "score"), _by_id(entry.samples, "score")
    same = [i for i in ours.keys() & theirs.keys() if ours[i] == theirs[i] and i in scores and i in baseline_scores]
    return sum(abs(scores[i] - baseline_scores[i]) > SCORE_EPSILON for i in same), len(same)


def without_fingerprint_note(baseline) -> str | None:
    """The one line saying a baseline saved before fingerprints cannot see a changed benchmark (None otherwise)."""
    if baseline is None or any(isinstance(entry.benchmark, dict) for entry in baseline.entries.values()):
        return None
    return (f"baseline {baseline.source or '(in memory)'} has no benchmark fingerprints: a changed prompt, "
            f"generation setting, metric or reference output cannot be told from a changed method; save it again "
            f"with --kvbench-save to see them")
