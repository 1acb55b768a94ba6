"""kvbench export --format kvpress / kvcache-factory: the files and names that kvpress's evaluate.py and
KVCache-Factory's run_longbench.py + eval.py write and read, built from a run's records.

Expected names and fields come from the official code: kvpress evaluation/evaluate.py
(EvaluationConfig.get_results_dir, save_config, _save_results) and benchmarks/ruler/calculate_metrics.py at
8bb29b9c; KVCache-Factory run_longbench.py (save path, prediction fields) and eval.py (results.csv) at c97f9d70.
"""

import csv
import io
import json
from pathlib import Path

import pytest
import yaml
from test_cli_support import RUN_ID, assert_usage_error, make_record, make_samples, run_cli, write_run

from pytest_kvbench.results.exports.kvcache_factory_layout import DATASETS

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

# evaluate.py's EvaluationConfig fields, as save_config writes them (threshold / head_compression_ratio
# are dropped when unset).
KVPRESS_CONFIG_FIELDS = {
    "dataset", "data_dir", "model", "device", "press_name", "compression_ratio", "key_channel_compression_ratio",
    "fraction", "max_new_tokens", "max_context_length", "query_aware", "needle_depth", "compression_interval",
    "target_size", "hidden_states_buffer_size", "output_dir", "log_level", "model_kwargs", "press_init_command",
    "seed", "fp8",
}


def ruler_record(task="niah_single_1", *, method="snapkv", budget="r0.5", n=500, protocol="query_agnostic",
                 model="default", predictions=None, references=None):
    samples = make_samples([1] * n, prefix=task)
    for index, sample in enumerate(samples):
        if predictions is not None:
            sample["prediction"] = predictions[index]
        if references is not None:
            sample["references"] = references[index]
    return with_protocol_key(make_record(method=method, budget=budget, task=task, suite="ruler",
                                         metric="string_match_all", context_length=4096, protocol=protocol,
                                         samples=samples, model=model, params={} if method != "snapkv" else None))


def with_protocol_key(record):
    """The key names a protocol other than question_in_window, as grid.Case.key does."""
    if record["protocol"] != "question_in_window":
        record["key"] += f"|protocol={record['protocol']}"
    return record


def export(capsys, tmp_path, records, fmt):
    results = tmp_path / "results"
    write_run(results, records)
    out = tmp_path / "out"
    code, _, err = run_cli(capsys, "export", RUN_ID, "--format", fmt, "--results", results, "--output", out)
    return code, err, out


def folders(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir())


def test_kvpress_folders_are_named_as_get_results_dir_names_them(capsys, tmp_path):
    records = [ruler_record(method="full", budget="full"), ruler_record(budget="r0.875"),
               ruler_record(budget="r0.25", protocol="question_in_window"), ruler_record(budget="r0.5", n=50),
               ruler_record(budget="r0.75", model="meta-llama/Llama-3.1-8B-Instruct")]
    code, err, out = export(capsys, tmp_path, records, "kvpress")
    assert code == 0, err
    assert folders(out) == [
        "ruler__4096__default__no_press__0.00",
        "ruler__4096__default__snapkv__0.25__query_aware",
        "ruler__4096__default__snapkv__0.50__fraction0.100",  # 50 of the leaderboard's 500 samples
        "ruler__4096__default__snapkv__0.88",  # f"{0.875:.2f}"
        "ruler__4096__meta-llama--Llama-3.1-8B-Instruct__snapkv__0.75",
    ]
    for folder in out.iterdir():
        assert sorted(p.name for p in folder.iterdir()) == ["config.yaml", "metrics.json", "predictions.csv"]


def test_kvpress_metrics_follow_calculate_metrics_not_the_record(capsys, tmp_path):
    # calculate_metrics removes control characters (RULER's own cleaning makes them newlines): "12\x0034"
    # holds the needle "1234" for kvpress. qa_* tasks score string_match_part, the others string_match_all.
    records = [ruler_record("niah_multikey_1", n=2, predictions=["12\x0034", "none"], references=[["1234"], ["77"]]),
               ruler_record("qa_1", n=2, predictions=["Paris", "Paris"], references=[["paris", "rome"], ["x"]]),
               ruler_record("niah_multivalue", n=2, predictions=["a b", "c"], references=[["a", "b", "c", "d"], ["c"]])]
    code, err, out = export(capsys, tmp_path, records, "kvpress")
    assert code == 0, err
    (folder,) = out.iterdir()
    assert json.loads((folder / "metrics.json").read_text()) == {
        "niah_multikey_1": {"string_match": 50.0}, "niah_multivalue": {"string_match": 75.0},
        "qa_1": {"string_match": 50.0}}
    rows = list(csv.DictReader(io.StringIO((folder / "predictions.csv").read_text())))
    assert len(rows) == 6 and {"task", "answer", "predicted_answer"} <= set(rows[0])  # what calculate_metrics reads
    assert rows[0]["predicted_answer"] == "12\x0034" and rows[0]["max_new_tokens"] == "128"
    assert {r["task"]: r["max_new_tokens"] for r in rows}["qa_1"] == "32"


def test_kvpress_config_yaml_holds_evaluation_config_fields(capsys, tmp_path):
    code, err, out = export(capsys, tmp_path, [ruler_record(budget="r0.25", protocol="question_in_window")], "kvpress")
    assert code == 0, err
    config = yaml.safe_load(next(out.iterdir()).joinpath("config.yaml").read_text())
    assert set(config) == KVPRESS_CONFIG_FIELDS
    assert (config["dataset"], config["data_dir"], config["press_name"], config["compression_ratio"],
            config["query_aware"], config["fraction"]) == ("ruler", "4096", "snapkv", 0.25, True, 1.0)
    assert "snapkv" in config["press_init_command"] and RUN_ID in config["press_init_command"]


def test_kvpress_leaves_out_what_is_not_its_protocol_and_says_so(capsys, tmp_path):
    records = [ruler_record(), ruler_record(budget="128"), ruler_record(protocol="shared_context"),
               make_record(task="qasper")]
    code, err, out = export(capsys, tmp_path, records, "kvpress")
    assert code == 0, err
    assert folders(out) == ["ruler__4096__default__snapkv__0.50"]
    assert "left out: " in err and "token and byte budgets" in err and "protocol shared_context" in err
    assert "not one of RULER's tasks" in err


def test_a_directory_export_without_output_or_with_nothing_to_export_is_a_one_line_error(capsys, tmp_path):
    write_run(tmp_path, [make_record(task="qasper")])
    code, _, err = run_cli(capsys, "export", RUN_ID, "--format", "kvpress", "--results", tmp_path)
    assert_usage_error(code, err, "--format kvpress writes a directory", "--output DIR")
    code, _, err = run_cli(capsys, "export", RUN_ID, "--format", "kvpress", "--results", tmp_path, "--output",
                           tmp_path / "out")
    assert_usage_error(code, err, "nothing to export in the kvpress layout", "not one of RULER's tasks")
    assert not (tmp_path / "out").exists()


def test_an_export_never_replaces_files_already_written(capsys, tmp_path):
    code, err, out = export(capsys, tmp_path, [ruler_record()], "kvpress")
    assert code == 0, err
    metrics = next(out.iterdir()) / "metrics.json"
    metrics.write_text("theirs")
    code, _, err = run_cli(capsys, "export", RUN_ID, "--format", "kvpress", "--results", tmp_path / "results",
                           "--output", out)
    assert_usage_error(code, err, "exists already", "choose another --output directory")
    assert metrics.read_text() == "theirs"


def longbench_record(dataset, *, method="snapkv", budget="128", score_pattern=(1, 0), model="default",
                     protocol="question_in_window"):
    fields = [{"length": 3000 + i, "all_classes": ["Yes", "No"]} for i in range(len(score_pattern))]
    samples = make_samples(score_pattern, prefix=dataset, fields=fields)
    return with_protocol_key(make_record(method=method, budget=budget, task=dataset, suite="longbench",
                                         metric="qa_f1", samples=samples, model=model, protocol=protocol,
                                         params={} if method != "snapkv" else None))


def test_kvcache_factory_writes_run_longbench_paths_and_fields(capsys, tmp_path):
    model = "/models/Meta-Llama-3-8B-Instruct"
    records = [longbench_record("qasper", model=model), longbench_record("qasper", budget="2048", model=model),
               longbench_record("qasper", method="full", budget="full", model=model),
               longbench_record("trec", method="knorm", model=model)]
    code, err, out = export(capsys, tmp_path, records, "kvcache-factory")
    assert code == 0, err
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == [
        "meta-llama-3-8b-instruct_128/qasper/FullKV.json", "meta-llama-3-8b-instruct_128/qasper/SnapKV.json",
        "meta-llama-3-8b-instruct_128/results.csv", "meta-llama-3-8b-instruct_128/trec/L2Norm.json",
        "meta-llama-3-8b-instruct_2048/qasper/FullKV.json", "meta-llama-3-8b-instruct_2048/qasper/SnapKV.json",
        "meta-llama-3-8b-instruct_2048/results.csv",
    ]
    # eval.py reads pred, answers, all_classes and length from each line
    trec = out / "meta-llama-3-8b-instruct_128/trec/L2Norm.json"
    lines = [json.loads(line) for line in trec.read_text().splitlines()]
    assert [(l["pred"], l["answers"], l["all_classes"], l["length"]) for l in lines] == [
        ("the answer", ["the answer"], ["Yes", "No"], 3000), ("something else", ["the answer"], ["Yes", "No"], 3001)]
    assert all(l["dataset"] == "trec" and l["_id"].startswith("trec-") for l in lines)


def test_kvcache_factory_results_csv_is_eval_py_table_with_the_16_dataset_average(capsys, tmp_path):
    records = [longbench_record(d, score_pattern=(1, 1) if i % 2 else (1, 0)) for i, d in enumerate(DATASETS)]
    records += [longbench_record("qasper", method="h2o")]
    code, err, out = export(capsys, tmp_path, records, "kvcache-factory")
    assert code == 0, err
    rows = list(csv.reader(io.StringIO((out / "default_128/results.csv").read_text())))
    assert rows[0] == ["dataset", *DATASETS, "average"]
    snapkv, h2o = rows[1], rows[2]  # eval.py's method order: ... SnapKV, StreamingLLM, H2O ...
    assert snapkv[0] == "SnapKV" and snapkv[1:17] == ["50.0", "100.0"] * 8 and snapkv[17] == "75.0"
    assert h2o[0] == "H2O" and h2o[2] == "50.0" and h2o[1] == "-1" and h2o[17] == ""  # not all 16: no average


def test_kvcache_factory_leaves_out_other_protocols_and_ratio_budgets(capsys, tmp_path):
    records = [longbench_record("qasper"), longbench_record("hotpotqa", protocol="query_agnostic"),
               longbench_record("hotpotqa", budget="r0.5"), longbench_record("qasper_e")]
    code, err, out = export(capsys, tmp_path, records, "kvcache-factory")
    assert code == 0
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.json")) == ["default_128/qasper/SnapKV.json"]
    assert "3 record(s)" not in err and "protocol query_agnostic" in err and "max_capacity_prompts" in err


def test_records_with_compressed_sliding_layers_are_left_out_of_both_layouts(capsys, tmp_path):
    """--kvbench-sliding compress is this project's setting: kvpress's presses skip sliding layers, and
    KVCache-Factory has no such setting, so such records are not exported as theirs (and the reason is said)."""
    compressed = ruler_record(method="streamingllm")
    compressed["key"] += "|sliding=compress"
    compressed["sliding"] = "compress"
    code, err, out = export(capsys, tmp_path / "kvpress", [ruler_record(), compressed], "kvpress")
    assert code == 0, err
    assert folders(out) == ["ruler__4096__default__snapkv__0.50"] and "kvpress's presses skip them" in err
    factory = longbench_record("qasper", method="streamingllm")
    factory["key"] += "|sliding=compress"
    factory["sliding"] = "compress"
    code, err, out = export(capsys, tmp_path / "factory", [longbench_record("qasper"), factory], "kvcache-factory")
    assert code == 0, err
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*.json")) == ["default_128/qasper/SnapKV.json"]
    assert "not one of KVCache-Factory's settings" in err
