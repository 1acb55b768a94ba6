"""``kvbench export RUN --format kvpress --output DIR``: RULER records in the layout of kvpress's evaluation.

NVIDIA/kvpress's evaluation/evaluate.py (at 8bb29b9c3078452a86d692f29123fa6c793e2b05) writes one folder per
(dataset, data_dir, model, press, compression ratio) named
``ruler__4096__<model with / as -->__<press_name>__<ratio:.2f>[__fraction<f:.3f>][__query_aware]`` holding
``predictions.csv`` (one row per sample: task, answer, predicted_answer, max_new_tokens, compression_ratio),
``metrics.json`` (``{task: {"string_match": score}}``, the output of benchmarks/ruler/calculate_metrics.py)
and ``config.yaml`` (its EvaluationConfig). The leaderboard reads those folders, so a row exported here sits
next to theirs.

The metric is recomputed the way calculate_metrics.py computes it (control characters removed from the
stripped prediction, string_match_part for qa_*, string_match_all otherwise, 100 x mean rounded to 2), not
copied from the record, whose RULER cleaning turns control characters into newlines. Our ``full`` is kvpress's
``no_press`` at 0.00; a method whose kvpress press has the same algorithm takes the press's registry name
(its parameters, which may differ from the press's defaults, are in config.yaml's press_init_command); any
other keeps its own label. A run with fewer than the leaderboard's 500 samples per task gets kvpress's
``fraction`` component, so a partial row is never mistaken for a full one. Questions and answer prefixes are
not kept in records, so predictions.csv has no question / answer_prefix columns.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections import defaultdict

from kvmethods.core.catalog import BUILTINS
from pytest_kvbench.results.exports.directory import DirectoryExport
from pytest_kvbench.results.record import Record
from pytest_kvbench.tasks import get_task
from pytest_kvbench.tasks.ruler.scoring import string_match_all, string_match_part

DATASET = "ruler"
LEADERBOARD_SAMPLES = 500  # per task in simonjegou/ruler (generate.sh --num_samples 500)
PROTOCOL_COMPONENT = {"query_agnostic": None, "question_in_window": "query_aware"}
PREDICTION_COLUMNS = ("task", "answer", "predicted_answer", "max_new_tokens", "compression_ratio")
_CONTROL = re.compile(r"[\x00-\x1f]")


def kvpress_clean(prediction: str) -> str:
    """calculate_metrics.py: control characters removed from the stripped prediction, then stripped."""
    return _CONTROL.sub("", (prediction or "").strip()).strip()


def string_match(task: str, predictions: list[str], references: list[list[str]]) -> float:
    """kvpress's per-task string_match: string_match_part for qa_* tasks, string_match_all otherwise."""
    metric = string_match_part if task.split("_")[0] == "qa" else string_match_all
    scores = [metric(kvpress_clean(p), refs) for p, refs in zip(predictions, references)]
    return round(sum(scores) / len(scores) * 100, 2)


def _press_name(method: str, label: str) -> str:
    """kvpress's PRESS_REGISTRY name of a built-in at its defaults, where the registry's press runs the same
    algorithm (the method's catalog row: kvpress_name), else our label."""
    entry = BUILTINS.get(method)
    return (entry.kvpress_name or label) if entry is not None and method == label else label


def _why_left_out(record: Record) -> str | None:
    if not record.is_scored:
        return "not scored"
    if record.task.suite != "ruler" or ":" in str(record.task.name):
        return "not one of RULER's tasks"
    if record.protocol not in PROTOCOL_COMPONENT:
        return (f"protocol {record.protocol} is not kvpress's "
                "(query_agnostic, or question_in_window as query_aware)")
    if record.budget.kind not in ("ratio", "none"):
        return "kvpress's compression_ratio is a fraction removed: token and byte budgets have none"
    if record.sliding != "keep":
        return "sliding-window layers compressed too (--kvbench-sliding compress): kvpress's presses skip them"
    return None


def _folder(record: Record, several_seeds: bool) -> str:
    label = record.labels
    model = str(record.model.name)
    ratio = record.budget.value or 0.0
    components = [DATASET, str(record.task.context_length), model.replace("/", "--"),
                  _press_name(record.method.name, label.method), f"{ratio:.2f}"]
    if (record.n_samples or 0) < LEADERBOARD_SAMPLES:
        components.append(f"fraction{record.n_samples / LEADERBOARD_SAMPLES:.3f}")
    if PROTOCOL_COMPONENT[record.protocol]:
        components.append(PROTOCOL_COMPONENT[record.protocol])
    if several_seeds:  # kvpress always runs seed 42; one folder per seed of ours
        components.append(label.seed)
    return "__".join(components)


def _config_yaml(record: Record, run_id: str | None) -> str:
    """evaluate.py's EvaluationConfig as save_config writes it (head_compression_ratio and threshold left out
    when unset, as it does)."""
    # lazy: PyYAML is not a dependency of its own (it comes with transformers); only kvpress exports need it
    import yaml

    label = record.labels
    params = json.dumps(record.method.params or {}, sort_keys=True)
    config = {
        "dataset": DATASET, "data_dir": str(record.task.context_length), "model": record.model.name,
        "device": record.device.type,
        "press_name": _press_name(record.method.name, label.method),
        "compression_ratio": record.budget.value or 0.0, "key_channel_compression_ratio": None,
        "fraction": min(1.0, record.n_samples / LEADERBOARD_SAMPLES), "max_new_tokens": None,
        "max_context_length": None, "query_aware": record.protocol == "question_in_window", "needle_depth": None,
        "compression_interval": None, "target_size": None, "hidden_states_buffer_size": None,
        "output_dir": ".", "log_level": "INFO",
        "model_kwargs": {"attn_implementation": record.model.attn_implementation,
                         "dtype": record.model.dtype},
        "press_init_command": f"pytest-kvbench {label.method} {params} (run {run_id})",
        "seed": record.seed, "fp8": False,
    }
    return yaml.safe_dump(config, default_flow_style=False, indent=2, sort_keys=False)


def _predictions_csv(records: list[Record]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(PREDICTION_COLUMNS)
    for record in records:
        task = record.task.name
        ratio = record.budget.value or 0.0
        for sample in record.samples:
            writer.writerow([task, repr(list(sample["references"])), sample.get("prediction") or "",
                             get_task(task).max_new_tokens, ratio])
    return buffer.getvalue()


def kvpress_export(records: list[Record], run_id: str | None = None) -> DirectoryExport:
    """The run's RULER records as kvpress's evaluation folders (files not written yet)."""
    export = DirectoryExport()
    groups: dict[str, list[Record]] = defaultdict(list)
    several_seeds = len({r.seed for r in records}) > 1
    for record in records:
        why = _why_left_out(record)
        if why:
            export.left_out[str(record.key)] = why
        else:
            groups[_folder(record, several_seeds)].append(record)
    for folder, members in groups.items():
        members.sort(key=lambda r: r.task.name)
        metrics = {r.task.name: {"string_match": string_match(r.task.name,
                                                                    [s.get("prediction") or "" for s in r.samples],
                                                                    [s["references"] for s in r.samples])}
                   for r in members}
        export.add(f"{folder}/predictions.csv", _predictions_csv(members))
        export.add(f"{folder}/metrics.json", json.dumps(metrics, indent=4))
        export.add(f"{folder}/config.yaml", _config_yaml(members[0], run_id))
    return export
