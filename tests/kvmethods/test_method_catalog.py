"""The method catalog (kvmethods/core/catalog.py) says what the classes say, so validation cannot drift.

The grid is validated from the catalog without importing a method (tests/plugin/test_plugin_startup.py). Its
rows are generated from the classes (`python -m kvmethods.core.catalog_gen`): here the generated file must be
what the command writes now, every entry is compared with its class (parameters, capabilities and the hooks
they need, whether validation needs the class, the names in kvpress and KVCache-Factory), and for the methods
validated from the catalog alone, any given parameters give the same outcome, the same message on a bad
value, as building the method does.
"""

import importlib
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvmethods import Capability, MethodError, available_methods, describe_method, get_method
from kvmethods.core.base import Method, capability_mismatch
from kvmethods.core import catalog_gen
from kvmethods.core.catalog import BUILTINS, kvpress_spec
from kvmethods.core.params import declared_params
from kvmethods.wrappers.score_wrapper import WrapperMethod


def validates_in_code(cls: type[Method]) -> bool:
    """A check() or from_params() of its own, or a base to build (wrappers)."""
    return (cls.check is not Method.check or cls.from_params.__func__ is not Method.from_params.__func__
            or issubclass(cls, WrapperMethod))


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_each_entry_describes_its_class(name):
    entry = BUILTINS[name]
    cls = getattr(importlib.import_module(entry.module), entry.class_name)
    assert cls.name == name
    assert entry.params == declared_params(cls), f"catalog.py's parameters of {name} differ from {entry.target}'s"
    assert cls.capabilities == entry.capabilities, f"{entry.target} declares capabilities of its own"
    assert capability_mismatch(cls) is None
    assert (Capability.WRAPS in cls.capabilities) == issubclass(cls, WrapperMethod)
    assert entry.checked_in_code == validates_in_code(cls)
    for external in catalog_gen.EXTERNAL_NAMES:
        assert getattr(entry, external) == getattr(cls, external), (name, external)


def test_the_generated_rows_are_what_the_classes_declare_now():
    """Stale when a class changed (a parameter, a capability, a name elsewhere) or a method was added or removed
    without running the generator."""
    assert catalog_gen.TARGET.read_text() == catalog_gen.render(), (
        "kvmethods/core/catalog_rows.py is stale: run python -m kvmethods.core.catalog_gen")
    assert catalog_gen.main(["--check"]) == 0


def test_the_generator_finds_every_built_in_class_and_nothing_else():
    assert [cls.name for cls in catalog_gen.builtin_classes()] == sorted(BUILTINS)
    assert "kvpress" not in BUILTINS  # the adapter's presses are named by the spec, not rows


def test_a_changed_class_makes_the_file_stale(monkeypatch):
    cls = next(cls for cls in catalog_gen.builtin_classes() if cls.name == "snapkv")
    monkeypatch.setattr(cls, "kvcache_factory_name", "SnapKV2")
    assert catalog_gen.render() != catalog_gen.TARGET.read_text()
    assert catalog_gen.main(["--check"]) == 1


def test_kvpress_specs_wrap_the_default_base_press():
    assert kvpress_spec("snapkv") == "kvpress:SnapKVPress"
    assert kvpress_spec("criticalkv") == "kvpress:CriticalKVPress:press=SnapKVPress"
    assert kvpress_spec("adakv") == "kvpress:AdaKVPress:press=SnapKVPress"
    assert kvpress_spec("h2o") is None and kvpress_spec("no-such-method") is None


def test_every_builtin_is_listed():
    assert set(BUILTINS) <= set(available_methods())
    assert {"full", "snapkv", "adakv", "kivi", "think", "decoding", "rkv"} <= set(BUILTINS)


ROOT = Path(__file__).resolve().parents[2]


def test_every_builtin_has_a_row_in_the_methods_readme():
    """kvmethods/README.md's method table (name, what it keeps, parameters, source) has a row per built-in: the
    third of the four files a new method touches (DEVELOPERS.md, *Adding a built-in method*)."""
    rows = re.findall(r"^\| `([a-z0-9_]+)` \|", (ROOT / "kvmethods" / "README.md").read_text(), re.MULTILINE)
    assert sorted(set(BUILTINS) - set(rows)) == []


def test_every_builtin_is_named_by_a_test():
    """Each built-in has a test of its own: a module under tests/ imports its class or names it in a spec (the
    second of the four files); the tests over every built-in (families, batches, specs) come on top."""
    texts = [path.read_text() for path in (ROOT / "tests").rglob("test_*.py")]
    untested = [name for name, entry in BUILTINS.items()
                if not any(re.search(rf"\b{entry.class_name}\b|[\"']{name}[\"':+]", text) for text in texts)]
    assert untested == []


def _outcome(build):
    try:
        described = build()
    except MethodError as error:
        return "error", str(error)
    return "ok", described


DECLARED = sorted(name for name, entry in BUILTINS.items() if not entry.checked_in_code)
VALUES = st.one_of(st.sampled_from(["0", "1", "2", "4", "7", "8", "-1", "0.5", "1.0", "1.5", "20", "abc", "",
                                    " 3 ", "true", "no", "avgpool", "maxpool", "none", "nan"]),
                   st.integers(-3, 600), st.floats(-2, 30, allow_nan=False), st.booleans())


def values_near(spec) -> st.SearchStrategy:
    """Values at and around a parameter's bounds and choices (as numbers and as the grid's strings), and others."""
    edges = [bound + step for bound in (spec.minimum, spec.maximum) if bound is not None
             for step in (-1, -0.5, 0, 0.5, 1)]
    near = st.sampled_from(edges + list(spec.choices or ()) + [spec.default, 3, 4])
    return st.one_of(near, near.map(str), VALUES)


def given_params(name: str) -> st.SearchStrategy:
    """Up to three of the method's parameters (now and then an unknown one, or per_turn / prefill_chunk,
    which every method takes), with values near their bounds."""
    declared = {spec.name: spec for spec in BUILTINS[name].params}
    others = st.sampled_from(["unknown", "per_turn", "prefill_chunk"])
    keys = st.lists(st.one_of(st.sampled_from(sorted(declared)), others) if declared else others,
                    max_size=3, unique=True)
    return keys.flatmap(lambda names: st.fixed_dictionaries(
        {key: values_near(declared[key]) if key in declared else VALUES for key in names}))


@pytest.mark.parametrize("name", DECLARED)
@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_catalog_validation_agrees_with_building_the_method(name, data):
    params = data.draw(given_params(name))
    described = _outcome(lambda: describe_method(name, **params))
    built = _outcome(lambda: get_method(name, **params))
    if built[0] == "ok":
        method = built[1]
        built = ("ok", (method.name, method.params(), method.capabilities))
    if described[0] == "ok":
        described = ("ok", (described[1].name, described[1].params, described[1].capabilities))
    assert described == built


@pytest.mark.parametrize("name", sorted(name for name, entry in BUILTINS.items()
                                         if entry.checked_in_code and Capability.WRAPS not in entry.capabilities
                                         and not entry.environment_check))
def test_a_method_checked_in_code_at_its_defaults_is_described_as_built(name):
    """The catalog describes such a method at its defaults without its class (kivi in the default grid: the plugin's
    start-up imports no torch); its defaults must pass its own check() and give the class's capabilities."""
    method = get_method(name)
    assert describe_method(name) == type(describe_method(name))(method.name, method.params(), method.capabilities)


def test_a_method_checking_the_environment_is_built_even_at_its_defaults(monkeypatch):
    """hf_quantized's check() asks whether its backend is installed: the catalog cannot answer that."""
    from kvmethods.storage import hf_quantized

    monkeypatch.setattr(hf_quantized, "quantized_backend_available", lambda backend: False)
    with pytest.raises(MethodError, match="not installed"):
        describe_method("hf_quantized")


@pytest.mark.parametrize("spec, params", [
    ("adakv", {"base": "snapkv", "window": "64"}),
    ("snapkv+kivi", {"bits": "4"}),
    ("snapkv", {"per_turn": "true"}),
    ("decoding", {"base": "streamingllm", "interval": "32"}),
])
def test_specs_that_need_their_class_are_built(spec, params):
    method = get_method(spec, **params)
    assert describe_method(spec, **params) == type(describe_method(spec, **params))(
        method.name, method.params(), method.capabilities)
