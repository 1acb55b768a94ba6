"""The runtime dispatches on what a method declares (kvmethods/core/capabilities.py), never on its name.

A new method that declares a capability takes the built-in's path for it (a head-adaptive one is refused
wherever adakv is), one that implements a path's hook without declaring it is refused when registered, and
no code compares a method's name.
"""

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import kvmethods
from kvmethods import (Capability, Method, MethodError, available_methods, describe_method, get_method,
                       register_method, unregister_method)
from kvmethods.core.capabilities import prefills_alone
from kvmethods.core.catalog import BUILTINS
from kvmethods.runtime.generation import generate
from kvmethods.runtime.shared_prefill import can_share_prefill
from kvmethods.wrappers.adakv import head_adaptive_mask
from kvmethods.testing import tiny_model

ROOT = Path(kvmethods.__file__).resolve().parents[1]  # the repository (wherever this test file sits)
# the receivers that hold a method (or a grid's method spec): `method.name`, `case.method.name`, `self.inner.name`
METHOD_HOLDERS = re.compile(r"(method|inner|evictor|thinner|quantizer|scorer|press)s?$", re.IGNORECASE)
NAME_COMPARISONS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def _holder(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _is_literal(node: ast.expr) -> bool:
    """A string or a collection of strings: what a method's name would be compared with."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_is_literal(element) for element in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def name_comparisons(path: Path, root: Path = ROOT) -> list[str]:
    """`x.name ==/!=/in/not in ...` where x holds a method, or (in kvmethods, where every `.name` compared with a
    string is a method's) anything's name against a string literal."""
    in_kvmethods = path.relative_to(root).parts[0] == "kvmethods"
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.Compare) or not all(isinstance(op, NAME_COMPARISONS) for op in node.ops):
            continue
        operands = [node.left, *node.comparators]
        for operand in operands:
            if not (isinstance(operand, ast.Attribute) and operand.attr == "name"):
                continue
            others = [other for other in operands if other is not operand]
            if METHOD_HOLDERS.search(_holder(operand.value)) or (in_kvmethods and any(map(_is_literal, others))):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_asks_for_a_method_by_its_name():
    files = [path for package in ("kvmethods", "pytest_kvbench", "bench", "scripts")
             for path in sorted((ROOT / package).rglob("*.py"))]
    assert len(files) > 50
    assert [hit for path in files for hit in name_comparisons(path)] == []


def test_the_name_check_finds_what_it_must(tmp_path):
    source = tmp_path / "kvmethods" / "sample.py"
    source.parent.mkdir()
    source.write_text('if method.name == "adakv": pass\nif case.method.name != FULL: pass\n'
                      'if self.name in ("h2o",): pass\nif inner.name not in NEEDS: pass\nif path.name == base: pass\n'
                      'if spec.name in BUILTINS: pass\n')
    assert [hit.split(": ", 1)[1] for hit in name_comparisons(source, tmp_path)] == [
        "method.name == 'adakv'", "case.method.name != FULL", "self.name in ('h2o',)", "inner.name not in NEEDS"]


@pytest.mark.parametrize("spec, params", [
    ("snapkv", {}), ("kvzip", {}), ("kivi", {}), ("think", {}), ("snapkv+kivi", {}), ("decoding", {}),
    ("rkv", {}), ("snapkv", {"prefill_chunk": "16"}), ("snapkv", {"per_turn": "true"}), ("adakv", {}),
    ("adakv", {"base": "kvzip"}), ("full", {}), ("criticalkv", {}),
])
def test_the_catalog_answers_which_methods_prefill_alone(spec, params):
    """What the ETA and the runner ask without building a method agrees with the built method."""
    described = describe_method(spec, **params).capabilities
    assert prefills_alone(described) == (not can_share_prefill(get_method(spec, **params)))


def test_whole_prompt_scorers_and_quantizers_share_the_forward_storages_reading_queries_do_not():
    """kvzip scores the shared full cache and quantizers store after the shared forward; ThinK's storage reads
    the prompt's last queries, and so does any composition holding it."""
    specs = ("kvzip", "kivi", "snapkv+kivi", "think", "snapkv+think", "snapkv+think+kivi")
    assert {spec: can_share_prefill(get_method(spec)) for spec in specs} == {
        "kvzip": True, "kivi": True, "snapkv+kivi": True, "think": False, "snapkv+think": False,
        "snapkv+think+kivi": False}


def test_wrappers_need_what_their_base_needs():
    assert Capability.SCORES_WHOLE_PROMPT in get_method("adakv", base="kvzip").capabilities
    assert Capability.SCORES_WHOLE_PROMPT not in get_method("adakv").capabilities
    assert Capability.SHARES_ACROSS_LAYERS in get_method("adakv", base="kvzip", across_layers=True).capabilities
    assert Capability.NEEDS_ALL_QUERIES in get_method("criticalkv", base="h2o").capabilities
    with pytest.raises(MethodError, match="cannot re-compress after each turn"):
        get_method("criticalkv", base="h2o", per_turn=True)  # h2o's scores need every prompt query
    assert Capability.LAYER_SCORES not in get_method("snapkv", prefill_chunk=8).capabilities  # no score() to reuse


@dataclass
class HeadShare(Method):
    """A head-adaptive method of a third party: the layer's budget shared among heads by key norms."""

    name = "headshare"
    capabilities = Capability.COMPRESSES | Capability.HEAD_ADAPTIVE

    def kept_indices(self, layer, n_keep):
        return head_adaptive_mask(layer.keys.float().norm(dim=-1), n_keep, 0.2)


@dataclass
class UndeclaredHeadShare(HeadShare):
    name = "undeclared_headshare"
    capabilities = Capability.COMPRESSES


@pytest.fixture
def headshare():
    register_method(HeadShare)
    yield
    unregister_method(HeadShare.name)


@pytest.mark.usefixtures("headshare")
@pytest.mark.parametrize("spec, params, refusal", [
    ("headshare", {"prefill_chunk": "8"}, "cannot prefill in chunks"),
    ("headshare", {"per_turn": "true"}, "cannot re-compress after each turn"),
    ("headshare+kivi", {}, "stores a ragged cache"),
    ("decoding", {"base": "headshare"}, "cannot be wrapped"),
])
def test_a_new_head_adaptive_method_is_refused_where_adakv_is(spec, params, refusal):
    with pytest.raises(MethodError, match=refusal):
        get_method(spec, **params)


def test_a_head_adaptive_selection_needs_its_declaration():
    model = tiny_model("llama")
    prompt = list(range(3, 43))
    out = generate(model, HeadShare(), "8", prompt, len(prompt), 2, set(), "question_in_window")
    assert len({count for layer in out.kept_tokens_per_head for count in layer}) > 1  # stored ragged
    with pytest.raises(MethodError, match="does not declare Capability.HEAD_ADAPTIVE"):
        generate(model, UndeclaredHeadShare(), "8", prompt, len(prompt), 2, set(), "question_in_window")


@pytest.mark.parametrize("capabilities, hooks, message", [
    (Capability.COMPRESSES, {"prefill_scores": lambda self, model, cache, ids: []},
     "implements prefill_scores() but does not declare Capability.SCORES_WHOLE_PROMPT"),
    (Capability.COMPRESSES, {"storage_layer": lambda self, keys, values, queries=None: None},
     "implements storage_layer() but does not declare Capability.OWN_STORAGE"),
    (Capability.COMPRESSES | Capability.COMPRESSES_WHILE_DECODING, {},
     "declares COMPRESSES_WHILE_DECODING but does not implement while_decoding()"),
    (Capability.COMPRESSES | Capability.LAYER_SCORES, {}, "declares LAYER_SCORES but does not implement score()"),
    ("compresses", {}, "capabilities must be a kvmethods.Capability"),
])
def test_registering_a_method_whose_hooks_and_capabilities_disagree_fails(capabilities, hooks, message):
    cls = dataclass(type("Mismatched", (Method,), {"name": "mismatched", "capabilities": capabilities, **hooks}))
    with pytest.raises(MethodError, match=re.escape(message)):
        register_method(cls)
    assert "mismatched" not in available_methods()


def test_a_declared_capability_takes_the_builtin_path():
    @dataclass
    class OwnForward(Method):
        name = "own_forward"
        capabilities = Capability.COMPRESSES | Capability.CHANGES_PREFILL

        def score(self, layer, n_keep):
            return layer.keys.float().norm(dim=-1)

    assert not can_share_prefill(OwnForward())
    assert can_share_prefill(get_method("snapkv"))


def test_the_reference_declares_nothing_and_storage_does_not_evict():
    """The reference alone declares nothing; the storage-only methods do not evict."""
    assert [name for name, entry in BUILTINS.items() if not entry.capabilities] == ["full"]
    storage = {name for name, entry in BUILTINS.items() if Capability.OWN_STORAGE in entry.capabilities}
    evicting = {name for name, entry in BUILTINS.items() if Capability.COMPRESSES in entry.capabilities}
    assert storage == {"kivi", "think", "hf_quantized"} and not storage & evicting
