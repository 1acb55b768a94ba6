"""Method registry, parameter coercion, budgets and bad-input errors (no model needed)."""

import textwrap
from dataclasses import dataclass

import pytest

import kvmethods
from kvmethods import (
    Budget,
    Method,
    MethodError,
    available_methods,
    get_method,
    param,
    register_method,
)

BUILTINS = ["full", "h2o", "knorm", "pyramidkv", "random", "snapkv", "streamingllm", "tova"]


def test_builtins_are_available_with_documented_defaults():
    assert set(BUILTINS) <= set(available_methods())
    assert get_method("snapkv").params() == {"window": 32, "kernel": 7, "pooling": "avgpool"}
    assert get_method("pyramidkv").params()["beta"] == 20.0
    assert get_method("streamingllm").params() == {"sinks": 4}
    assert get_method("h2o").params() == {"recent_ratio": 0.5}
    assert get_method("random").params() == {"seed": 0}
    assert get_method("full").params() == {}


def test_string_parameters_from_the_grid_are_coerced_by_field_type():
    method = get_method("snapkv", window="16", kernel="5", pooling="maxpool")
    assert method.params() == {"window": 16, "kernel": 5, "pooling": "maxpool"}
    assert get_method("pyramidkv", beta="10").beta == 10.0
    assert get_method("h2o", recent_ratio=1).recent_ratio == 1.0


@pytest.mark.parametrize(
    "name, params, fragment",
    [
        ("snapkv", {"window": "wide"}, "'window' must be int"),
        ("snapkv", {"window": 3.5}, "'window' must be int"),
        ("snapkv", {"window": True}, "'window' must be int"),
        ("snapkv", {"pooling": "median"}, "avgpool|maxpool|none"),
        ("snapkv", {"kernel": 4}, "odd"),
        ("snapkv", {"window": 0}, ">= 1"),
        ("h2o", {"recent_ratio": "1.5"}, "[0, 1]"),
        ("snapkv", {"windw": 8}, "valid parameters: window:int=32, kernel:int=7, pooling:str=avgpool"),
        ("full", {"window": 8}, "valid parameters: (none)"),
    ],
)
def test_bad_parameters_raise_one_line_method_errors(name, params, fragment):
    with pytest.raises(MethodError) as caught:
        get_method(name, **params)
    assert fragment in str(caught.value)
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_unknown_method_names_the_valid_ones():
    with pytest.raises(MethodError, match=r"^unknown method 'snapk' \(did you mean 'snapkv'.*\?\); "
                                          "valid methods: adakv, capkv, chunkkv, criticalkv, .*, h2o, .*, snapkv"):
        get_method("snapk")


@pytest.mark.parametrize(
    "raw, kind, value, spec",
    [("1024", "tokens", 1024, "1024"), (512, "tokens", 512, "512"), ("r0.5", "ratio", 0.5, "r0.5"),
     ("r.25", "ratio", 0.25, "r0.25"), ("r0", "ratio", 0.0, "r0")],
)
def test_budget_spellings(raw, kind, value, spec):
    budget = Budget.parse(raw)
    assert (budget.kind, budget.value, budget.spec) == (kind, value, spec)
    assert Budget.parse(budget.spec) == budget


@pytest.mark.parametrize("raw", ["0", 0, "-4", -4, "abc", "", "r1", "r1.5", "r-0.1", "12.5", 1.5, None, True])
def test_bad_budgets_raise(raw):
    with pytest.raises(MethodError, match="invalid budget"):
        Budget.parse(raw)


def test_budget_tokens_for_prompt_length():
    assert Budget.parse("1024").tokens_for(4000) == 1024
    assert Budget.parse("1024").tokens_for(300) == 300  # at or above the prompt: no compression
    assert Budget.parse("r0.5").tokens_for(301) == 150  # removes half, rounding the kept part down
    assert Budget.parse("r0.75").tokens_for(1000) == 250
    assert Budget.parse("r0").tokens_for(77) == 77
    assert Budget.parse("r0.99").tokens_for(10) == 1


@dataclass
class KeepOldest(Method):
    """Keeps the first n positions: a deliberately simple third-party method."""

    name = "keep_oldest_test"
    offset: int = param(0, "unused, exercises coercion", minimum=0)

    def score(self, layer, n_keep):
        import torch

        T = layer.seq_len
        return (-torch.arange(T, dtype=torch.float32)).expand(*layer.keys.shape[:2], T)


def test_register_method_as_decorator_makes_it_collectable():
    try:
        register_method(KeepOldest)
        register_method(KeepOldest)  # idempotent (conftests may be imported twice)
        assert "keep_oldest_test" in available_methods()
        method = get_method("keep_oldest_test", offset="3")
        assert method.params() == {"offset": 3}
        with pytest.raises(MethodError, match="valid parameters: offset:int=0"):
            get_method("keep_oldest_test", nope=1)
    finally:
        kvmethods.unregister_method("keep_oldest_test")
    assert "keep_oldest_test" not in available_methods()


def test_register_rejects_clashes_and_non_methods():
    @dataclass
    class Impostor(Method):
        name = "snapkv"

    with pytest.raises(MethodError, match="already exists"):
        register_method(Impostor)
    with pytest.raises(MethodError, match="not a subclass"):
        register_method(object)


def write_entry_point_package(root, method_name="ep_method_test", class_name="EpMethod"):
    (root / "kvbench_ep_demo.py").write_text(textwrap.dedent(f"""
        from dataclasses import dataclass
        from kvmethods import Method, param, top_positions

        @dataclass
        class {class_name}(Method):
            name = "{method_name}"
            stride: int = param(2, "keep every stride-th position", minimum=1)

            def score(self, layer, n_keep):
                import torch
                T = layer.seq_len
                scores = (torch.arange(T) % self.stride == 0).float() - torch.arange(T) / (10 * T)
                return scores.expand(*layer.keys.shape[:2], T)
        """))
    dist = root / "kvbench_ep_demo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kvbench-ep-demo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[kvbench.methods]\n{method_name} = kvbench_ep_demo:{class_name}\n")


def test_entry_point_methods_are_discovered_and_loaded(tmp_path, monkeypatch):
    write_entry_point_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "ep_method_test" in available_methods()
    method = get_method("ep_method_test", stride="3")
    assert type(method).__name__ == "EpMethod" and method.params() == {"stride": 3}


def test_broken_entry_point_is_a_clear_error(tmp_path, monkeypatch):
    dist = tmp_path / "kvbench_broken-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: kvbench-broken\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[kvbench.methods]\nbroken_test = no_such_module_xyz:Thing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MethodError, match="entry point 'broken_test'.*failed to load: ModuleNotFoundError"):
        get_method("broken_test")


@pytest.mark.parametrize("value", ["99999999999999999999999", -2**63 - 1])
def test_an_integer_parameter_beyond_64_bits_is_refused_in_one_line(value):
    with pytest.raises(MethodError, match=r"^snapkv: parameter 'window' is out of range \(a 64-bit integer"):
        get_method("snapkv", window=value)


def test_every_public_name_resolves():
    """`from kvmethods import *` and each name of __all__ (LayerInputs, Method, ... are imported on first use): a module
    moved without its entry in the lazy table would fail here, not in a third party's method."""
    for name in kvmethods.__all__:
        assert getattr(kvmethods, name) is not None, name
    namespace = {}
    exec("from kvmethods import *", namespace)
    assert namespace["LayerInputs"].__module__ == "kvmethods.core.layer_inputs"
