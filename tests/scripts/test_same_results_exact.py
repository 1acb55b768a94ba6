"""The determinism step's comparison (.ci/same_results.py --exact, run by .ci/determinism.sh): two runs of the
same grid must hold bitwise-equal records, their timings, meters and run ids aside; any other field that differs
(a prediction, a per-sample KL, a kept-token count) is named by its path."""

import importlib.util
import sys
from pathlib import Path

import pytest
from test_cli_support import make_record, write_run

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

ROOT = Path(__file__).resolve().parents[2]


def same_results():
    spec = importlib.util.spec_from_file_location("ci_same_results", ROOT / ".ci" / "same_results.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def two_runs(tmp_path, change) -> tuple[str, str]:
    first, second = make_record(), make_record()
    change(second)
    write_run(tmp_path / "a", [first], run_id="bench_a")
    write_run(tmp_path / "b", [second], run_id="bench_b")
    return str(tmp_path / "a" / "runs" / "bench_a"), str(tmp_path / "b" / "runs" / "bench_b")


def retimed(record: dict) -> None:
    record["latency"]["total_s"] += 1.0
    record["memory"]["peak_bytes"] += 4096
    record["model"]["load_s"] = 9.9
    for sample in record["samples"]:
        sample["prefill_ms"] += 3.0
        sample["decode_ms"] += 5.0


def test_runs_differing_only_in_timings_are_the_same(tmp_path, capsys):
    assert same_results().main(["--exact", *two_runs(tmp_path, retimed)]) == 0
    assert "bitwise-equal records (timings aside)" in capsys.readouterr().out


def test_any_measured_field_that_differs_is_named_by_its_path(tmp_path, capsys):
    def drifted(record: dict) -> None:
        retimed(record)
        record["samples"][1]["kl"] = record["samples"][1].get("kl", 0.0) + 1e-9
        record["samples"][2]["prediction"] = "something else"

    assert same_results().main(["--exact", *two_runs(tmp_path, drifted)]) == 1
    out = capsys.readouterr().out
    assert "samples[1].kl" in out and "samples[2].prediction" in out and "prefill_ms" not in out
    # without --exact the looser comparison (slurm.sh's) sees the prediction too
    assert same_results().main(list(two_runs(tmp_path / "loose", drifted))) == 1


def test_the_merged_shards_comparison_lets_a_kl_move_in_its_fifth_digit_and_nothing_else(tmp_path, capsys):
    """slurm.sh's comparison: a shard batches its samples with other members than one process does, which on some
    CPUs moves a KL in its fifth significant digit; predictions, scores and agreement must still be equal."""
    def rounded(record: dict) -> None:
        for sample in record["samples"]:
            sample["kl"] *= 1 + 3.5e-5
        record["fidelity"]["kl"] *= 1 + 3.5e-5

    assert same_results().main(list(two_runs(tmp_path / "kl", rounded))) == 0

    def moved(record: dict) -> None:
        record["samples"][1]["kl"] *= 1.01

    assert same_results().main(list(two_runs(tmp_path / "moved", moved))) == 1
    assert "samples" in capsys.readouterr().out
