"""``kvbench export RUN --format kvcache-factory --output DIR``: LongBench records in KVCache-Factory's layout.

Zefan-Cai/KVCache-Factory (at c97f9d706d63d1b56e980f8b81b2a924c21162b3) writes, per model and budget,
``<model>_<max_capacity_prompts>/<dataset>/<Method>.json`` (run_longbench.py: one JSON line per sample with
pred, answers, all_classes, length, dataset, language, _id; the model is the last path component of the
lowercased model path) and its eval.py reads them back into ``<model>_<budget>/results.csv``: a row
``dataset, <16 datasets>`` then one row per method, -1 where a dataset has no predictions. Here each budget
folder gets the predictions of every method (the uncompressed ``full`` as FullKV in every budget folder,
as a FullKV run under any budget would write it) and that table with an ``average`` column: the mean of the
16 datasets that the published LongBench tables report, left empty unless all 16 are there. eval.py's
scorer and this project's LongBench scores are the same (first line for trec/triviaqa/samsum, max over
references, 100 x mean rounded to 2), so the record's score is written. The prompt, input and context
texts are not kept in records and are not written; eval.py does not read them.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections import defaultdict

from kvmethods.core.catalog import BUILTINS
from pytest_kvbench.results.exports.directory import DirectoryExport
from pytest_kvbench.results.record import Record

DATASETS = ("narrativeqa", "qasper", "multifieldqa_en", "hotpotqa", "2wikimqa", "musique", "gov_report", "qmsum",
            "multi_news", "trec", "triviaqa", "samsum", "passage_count", "passage_retrieval_en", "lcc", "repobench-p")
# KVCache-Factory's method names in the order of eval.py's rows (a method's own name: its catalog row)
EVAL_ORDER = ("FullKV", "random", "SnapKV", "StreamingLLM", "H2O", "PyramidKV", "L2Norm", "ThinK", "AdaKV")
PROTOCOL = "question_in_window"  # run_longbench.py compresses the whole prompt, question included
MISSING = -1  # eval.py's value for a dataset without predictions


def model_folder_name(model: str) -> str:
    """run_longbench.py: model_path.lower().split("/")[-1]."""
    return str(model).lower().rstrip("/").split("/")[-1]


def _why_left_out(record: Record) -> str | None:
    if not record.is_scored:
        return "not scored"
    if record.task.suite != "longbench" or record.task.name not in DATASETS:
        return "not one of KVCache-Factory's 16 LongBench datasets"
    if record.protocol != PROTOCOL:
        return (f"protocol {record.protocol}: KVCache-Factory compresses the question with the context "
                f"({PROTOCOL})")
    if record.budget.kind not in ("tokens", "none"):
        return "KVCache-Factory's budgets are KV tokens per layer and head (max_capacity_prompts)"
    if record.sliding != "keep":
        return "sliding-window layers compressed too (--kvbench-sliding compress): not one of KVCache-Factory's settings"
    return None


def _method_name(record: Record) -> str:
    label = record.labels.method
    name = record.method.name
    entry = BUILTINS.get(name)
    return (entry.kvcache_factory_name or label) if entry is not None and label == name else label


def _predictions(record: Record) -> str:
    dataset = record.task.name
    lines = []
    for sample in record.samples:
        fields = sample.get("fields") or {}
        lines.append(json.dumps({"pred": sample.get("prediction") or "", "answers": list(sample["references"]),
                                 "all_classes": fields.get("all_classes"), "length": fields.get("length"),
                                 "dataset": dataset, "language": "en", "_id": sample["id"]}, ensure_ascii=False))
    return "".join(line + "\n" for line in lines)


def _results_csv(scores: dict[str, dict[str, float]]) -> str:
    """eval.py's results.csv (methods as rows, datasets as columns) with the table's average."""
    order = list(EVAL_ORDER)
    methods = sorted(scores, key=lambda m: (order.index(m) if m in order else len(order), m))
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["dataset", *DATASETS, "average"])
    for method in methods:
        row = [scores[method].get(dataset, MISSING) for dataset in DATASETS]
        average = round(statistics.fmean(row), 2) if all(d in scores[method] for d in DATASETS) else ""
        writer.writerow([method, *row, average])
    return buffer.getvalue()


def kvcache_factory_export(records: list[Record], run_id: str | None = None) -> DirectoryExport:
    """The run's LongBench records as KVCache-Factory's results folders (files not written yet)."""
    export = DirectoryExport()
    kept = []
    for record in records:
        why = _why_left_out(record)
        if why:
            export.left_out[str(record.key)] = why
        else:
            kept.append(record)
    budgets = defaultdict(set)  # model -> token budgets it ran
    for record in kept:
        if record.budget.kind == "tokens":
            budgets[record.model.name].add(int(record.budget.value))
    tables: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for record in kept:
        model = record.model.name
        own = [int(record.budget.value)] if record.budget.kind == "tokens" else sorted(budgets[model])
        if not own:
            export.left_out[str(record.key)] = "the full cache's row goes into a budget folder: run a budget too"
        for budget in own:
            folder = f"{model_folder_name(model)}_{budget}"
            method, dataset = _method_name(record), record.task.name
            export.add(f"{folder}/{dataset}/{method}.json", _predictions(record))
            tables[folder][method][dataset] = record.score
    for folder, scores in tables.items():
        export.add(f"{folder}/results.csv", _results_csv(scores))
    return export
