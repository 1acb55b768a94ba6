"""Shared prefill in real runs: the same records with sharing on and off, serially, under -n 2 and with -k,
and items of a reference group really take their caches from one forward."""

import pytest

from helpers import hook_records, run_bench
from kvmethods import Capability, MethodError, available_methods, get_method
from kvmethods.runtime.shared_prefill import can_share_prefill

def _runs_here(name: str) -> bool:
    """Every built-in but those whose optional backend is missing here (hf_quantized needs quanto) and
    those compressing while decoding, whose interval these short answers never reach (a usage error)."""
    try:
        method = get_method(name)
    except MethodError:
        return False
    return Capability.COMPRESSES_WHILE_DECODING not in method.capabilities


METHODS = ",".join(m for m in available_methods() if _runs_here(m))  # kvzip (not sharing) included
NOT_SHARING = {m for m in METHODS.split(",") if not can_share_prefill(get_method(m))}
GRID = [
    "--kvbench-methods", METHODS,
    "--kvbench-budgets", "16,r0.5",
    "--kvbench-tasks", "niah_single_1,passage_retrieval_en",
    "--kvbench-context-lengths", "256",
    "--kvbench-samples", "2",
    "--kvbench-max-prompt-tokens", "320",
    "--kvbench-torch-threads", "1",
    # members one after another: sharing the prefill changes nothing, bit for bit; batched decoding's equality
    # (float rounding of another batch shape) is tests/kvmethods/test_batched_decode.py's
    "--kvbench-decode-batch", "1",
]
SUBSET = "full or snapkv or pyramidkv or kvzip"
PARTS = "full or snapkv or pyramidkv or tova"  # 7 items of one group: two parts of two methods each


def outcome(record: dict) -> dict:
    """What must not depend on how the prefill ran."""
    fields = ("id", "prediction", "score", "kept_tokens_per_layer", "kept_tokens_per_head", "kv_bytes_after",
              "kl", "agreement", "decode_kl")
    return {"score": record["score"], "fidelity": record["fidelity"],
            "samples": [{k: s.get(k) for k in fields} for s in record["samples"]]}


def records_by_key(directory) -> dict:
    records = [call["record"] for call in hook_records(directory)]
    assert records and all(r["status"] == "passed" for r in records), [r["message"] for r in records]
    return {r["key"]: r for r in records}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("shared_prefill")
    variants = {
        "shared": [],
        "alone": ["--kvbench-no-share-prefill"],
        "shared -n 2 -k": ["-n", "2", "--dist", "loadgroup", "-k", SUBSET],
        "shared -n 2 load": ["-n", "2", "--dist", "load"],
        # one group, two workers: cut in two parts (wiring/distributed/group_parts.py)
        "parts -n 2": ["-n", "2", "--dist", "loadgroup", "-k", f"niah_single_1 and ({PARTS})"],
    }
    out = {}
    for name, extra in variants.items():
        work = base / name.replace(" ", "_")
        proc = run_bench(work, *GRID, "--kvbench-results", str(base / f"res_{len(out)}"), *extra)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        out[name] = records_by_key(work)
    return out


def test_sharing_changes_no_score_kept_position_kl_or_agreement(runs):
    alone = runs["alone"]
    assert len(alone) == 2 * (1 + 2 * (len(METHODS.split(",")) - 1))
    for name in ("shared", "shared -n 2 load"):
        assert runs[name].keys() == alone.keys()
        for key, record in runs[name].items():
            assert outcome(record) == outcome(alone[key]), (name, key)


def test_a_k_subset_under_n2_runs_only_its_methods_with_the_same_results(runs):
    subset = runs["shared -n 2 -k"]
    assert {r["method"]["name"] for r in subset.values()} == {"full", "snapkv", "pyramidkv", "kvzip"}
    for key, record in subset.items():
        assert outcome(record) == outcome(runs["alone"][key]), key


def assert_one_forward_per_sample(records: dict) -> None:
    """Every sharing item of a group got its prefill from the reference's very forward."""
    for key, record in records.items():
        method = record["method"]["name"]
        if method in NOT_SHARING:  # kvzip, quantizing storages: prefill on their own
            assert all(s["shared_prefill_ms"] is None for s in record["samples"])
            continue
        full = records[f"{record['model']['name']}|full|full|{key.split('|', 3)[3]}"]
        for sample, reference in zip(record["samples"], full["samples"]):
            assert sample["shared_prefill_ms"] == reference["shared_prefill_ms"] > 0
            if method != "full":
                assert sample["prefill_ms"] == pytest.approx(sample["shared_prefill_ms"] + sample["compression_ms"])


def test_a_group_prefills_each_sample_once_and_labels_the_parts(runs):
    assert_one_forward_per_sample(runs["shared"])
    assert_one_forward_per_sample(runs["shared -n 2 -k"])  # loadgroup: a group's items share a worker
    assert all(s["shared_prefill_ms"] is None for r in runs["alone"].values() for s in r["samples"])


def test_the_meter_scope_balances_decodes_done_for_and_in_other_items(runs):
    """Every sample decode one item's run made for another is counted on both sides; none without sharing."""
    assert all(r["meter_scope"] == {"decoded_for_other_items": 0, "decoded_in_other_items": 0}
               for r in runs["alone"].values())
    for name in ("shared", "shared -n 2 -k"):
        scopes = [r["meter_scope"] for r in runs[name].values()]
        hosted = sum(s["decoded_for_other_items"] for s in scopes)
        assert hosted == sum(s["decoded_in_other_items"] for s in scopes) > 0, name


def test_one_group_on_two_workers_runs_in_two_parts_with_the_same_results(runs):
    """Each part repeats the group's forward on its worker and shares it among its own items only."""
    parts = runs["parts -n 2"]
    assert {r["method"]["name"] for r in parts.values()} == {"full", "snapkv", "pyramidkv", "tova"}
    assert {r["task"]["name"] for r in parts.values()} == {"niah_single_1"}
    for key, record in parts.items():
        assert outcome(record) == outcome(runs["alone"][key]), key
    forwards = {}  # one forward per sample and part: the shared_prefill_ms its items got from it
    for record in parts.values():
        if record["method"]["name"] not in NOT_SHARING:
            forwards.setdefault(record["method"]["name"], set()).add(tuple(s["shared_prefill_ms"] for s in record["samples"]))
    assert all(len(seen) == 1 for seen in forwards.values()), forwards  # a method's budgets share one part
    assert len(set().union(*forwards.values())) == 2, forwards  # two parts, two forwards per sample
