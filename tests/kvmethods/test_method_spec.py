"""The method-spec grammar (kvmethods/spec.py) prints every spec it parses in its canonical spelling, and
parses what it prints back to the same value.

Specs are generated from the grammar: every built-in method (but hf_quantized, whose backend may be absent)
with random valid parameters, wrappers with a base and the base's parameters, compositions in any order
with bare or prefixed keys, and budgets; each is written the ways a user may write it (spaces, parameters
in any order, `07`, `yes`, `0.50`, `kivi+snapkv`). The canonical spelling expected is built here from the
generated values, not by the code under test.
"""

import re
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvmethods import Budget, Capability, MethodError, describe_method
from kvmethods.core.catalog import BUILTINS
from kvmethods.core.params import ParamSpec
from kvmethods.spec import MethodSpec

WRAPPERS = sorted(name for name, entry in BUILTINS.items() if Capability.WRAPS in entry.capabilities)
PLAIN = sorted(name for name in BUILTINS if name not in WRAPPERS and name != "hf_quantized")
EVICTORS = sorted(name for name in PLAIN if Capability.COMPRESSES in BUILTINS[name].capabilities)
THINK = next(name for name, entry in BUILTINS.items() if Capability.PRUNES_CHANNELS in entry.capabilities)
QUANTIZER = "kivi"  # the one quantizer that takes ThinK's thin keys
assert Capability.OWN_STORAGE in BUILTINS[QUANTIZER].capabilities
# Values the methods' own checks accept (the catalog declares no such rule): KIVI's bits and grouping.
SPECIAL_VALUES = {("kivi", "bits"): st.sampled_from([2, 4]), ("kivi", "group_size"): st.sampled_from([8, 16, 32]),
                  ("kivi", "residual"): st.sampled_from([32, 64, 128]), ("decoding", "interval"): st.integers(64, 256),
                  ("rkv", "interval"): st.integers(64, 256)}
TRUE, FALSE = ("true", "True", "1", "yes", "on", " TRUE "), ("false", "False", "0", "no", "off")
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                                           HealthCheck.too_slow])


def values(method: str, param: ParamSpec) -> st.SearchStrategy:
    """Valid values of one declared parameter."""
    if (method, param.name) in SPECIAL_VALUES:
        return SPECIAL_VALUES[method, param.name]
    if param.choices:
        return st.sampled_from(param.choices)
    if param.kind is bool:
        return st.booleans()
    low = param.minimum or 0
    if param.kind is int:
        ints = st.integers(int(low), int(low) + 64)
        return ints.map(lambda value: value | 1) if param.odd else ints
    high = param.maximum if param.maximum is not None else low + 1
    return st.integers(0, 1000).map(lambda step: round(low + (high - low) * step / 1000, 3))


@st.composite
def written(draw, value) -> tuple[str, str]:
    """(how a user may write `value`, how the canonical spec prints it)."""
    if isinstance(value, bool):
        return draw(st.sampled_from(TRUE if value else FALSE)), str(value)
    if isinstance(value, int):
        return draw(st.sampled_from([str(value), f" {value} ", f"0{value}"])), str(value)
    if isinstance(value, float):
        return draw(st.sampled_from([repr(value), f"{value:.6f}", f" {value:.15g}"])), f"{value:.15g}"
    return draw(st.sampled_from([value, f" {value} "])), value


@st.composite
def chosen_params(draw, method: str, params: tuple[ParamSpec, ...]) -> list[tuple[str, str, str]]:
    """Some of `params` with valid values: (key, as written, canonical)."""
    picked = draw(st.lists(st.sampled_from(params), unique_by=lambda param: param.name)) if params else []
    return [(param.name, *draw(written(draw(values(method, param))))) for param in picked]


@st.composite
def plain_specs(draw) -> tuple[list[str], str, list]:
    name = draw(st.sampled_from(PLAIN))
    return [name], name, draw(chosen_params(name, BUILTINS[name].params))


@st.composite
def wrapper_specs(draw) -> tuple[list[str], str, list]:
    """A wrapper, its base named or left to the default, parameters of both written flat."""
    wrapper, base = draw(st.sampled_from(WRAPPERS)), draw(st.sampled_from(EVICTORS + ["criticalkv"]))
    declared = BUILTINS[wrapper].params
    own = tuple(param for param in declared if param.name != "base")
    own_names = {param.name for param in declared}
    chosen = draw(chosen_params(wrapper, own))
    chosen += draw(chosen_params(base, tuple(p for p in BUILTINS[base].params if p.name not in own_names)))
    default_base = next(param.default for param in declared if param.name == "base")
    if base != default_base or draw(st.booleans()):
        chosen.append(("base", draw(st.sampled_from([base, f" {base}"])), base))
    return [wrapper], wrapper, chosen


@st.composite
def composition_specs(draw) -> tuple[list[str], str, list]:
    """Two or three parts (at most one evictor, ThinK, KIVI; ThinK or KIVI among them) in any order; a key
    declared by several parts is prefixed by its part, the others are prefixed or not."""
    evictor = draw(st.sampled_from([None, *EVICTORS]))
    think, quantizer = draw(st.sampled_from([(True, False), (False, True), (True, True)]))
    parts = [name for name in (evictor, THINK if think else None, QUANTIZER if quantizer else None) if name]
    assume(len(parts) >= 2)
    declared = {name: BUILTINS[name].params for name in parts}
    if think and quantizer:  # ThinK's own full-channel window does not apply under KIVI
        declared[THINK] = tuple(param for param in declared[THINK] if param.name != "recent")
    chosen = []
    for name in parts:
        for key, as_written, canonical in draw(chosen_params(name, declared[name])):
            shared = sum(key in {param.name for param in declared[other]} for other in parts) > 1
            if shared or draw(st.booleans()):
                key = f"{name}.{key}"
            chosen.append((key, as_written, canonical))
    return draw(st.permutations(parts)), "+".join(parts), chosen


@st.composite
def user_specs(draw) -> tuple[str, MethodSpec]:
    """(a spec as a user may write it, its canonical MethodSpec)."""
    names, canonical_name, chosen = draw(st.one_of(plain_specs(), wrapper_specs(), composition_specs()))
    if canonical_name in EVICTORS and draw(st.booleans()):  # any evicting method: chunked, re-compressed per turn
        chunk, per_turn = draw(st.sampled_from([0, 64, 512])), draw(st.booleans())
        chosen += [("prefill_chunk", *draw(written(chunk))), ("per_turn", *draw(written(per_turn)))]
    pairs = [f"{key}={as_written}" for key, as_written, _ in draw(st.permutations(chosen))]
    text = ":".join([draw(st.sampled_from(["", " "])) + "+".join(names), *pairs])
    return text, MethodSpec.of(canonical_name, {key: canonical for key, _, canonical in chosen})


def canonical_spelling(text: str) -> MethodSpec:
    """What the grid makes of a spec: parsed, described by the registry, respelled."""
    parsed = MethodSpec.parse(text)
    try:
        described = describe_method(parsed.name, **parsed.param_dict)
    except MethodError:  # a cross-parameter rule the strategies do not know (decoding's interval >= window)
        assume(False)
    return parsed.respelled(described.name, described.params)


@SETTINGS
@given(user_specs())
def test_a_parsed_spec_prints_in_its_canonical_spelling(case):
    text, expected = case
    assert str(canonical_spelling(text)) == str(expected)
    assert canonical_spelling(text).label == expected.label


@SETTINGS
@given(user_specs())
def test_a_printed_spec_parses_back_to_itself(case):
    text, canonical = case
    assert MethodSpec.parse(str(canonical)) == canonical
    parsed = MethodSpec.parse(text)
    assert MethodSpec.parse(str(parsed)) == parsed


@pytest.mark.parametrize("text, label", [
    ("snapkv", "snapkv"),
    ("snapkv:window=64:kernel=5", "snapkv(kernel=5,window=64)"),
    ("kvpress:AdaKVPress:press=SnapKVPress:press.window_size=8",
     "kvpress:AdaKVPress(press=SnapKVPress,press.window_size=8)"),
    ("adakv:base=snapkv:window=16", "adakv(base=snapkv,window=16)"),
])
def test_labels_of_item_ids_are_unchanged(text, label):
    assert MethodSpec.parse(text).label == label


def test_a_toml_table_is_the_spec_its_text_names():
    table = {"name": "kvpress:AdaKVPress", "press": {"name": "SnapKVPress", "window_size": 8}}
    assert MethodSpec.from_table(table) == MethodSpec.parse("kvpress:AdaKVPress:press=SnapKVPress:press.window_size=8")


def test_a_wrapper_spec_splits_into_its_own_and_its_base():
    own, base = MethodSpec.parse("adakv:alpha=0.5:window=16").wrapping({"base", "alpha"}, "snapkv")
    assert (own, base) == (MethodSpec.parse("adakv:alpha=0.5"), MethodSpec.parse("snapkv:window=16"))


@pytest.mark.parametrize("text, message", [
    ("snapkv:window=1:kernel", "method parameter 'kernel' in 'snapkv:window=1:kernel' is not of the form name=value"),
    ("snapkv:window=1:window=2", "sets 'window' twice (window=1 and window=2)"),
    (":window=1", "has no name"),
])
def test_malformed_specs_are_one_line_errors(text, message):
    with pytest.raises(MethodError, match=re.escape(message)):
        MethodSpec.parse(text)


@pytest.mark.parametrize("text", ["snapkv+", "+kivi", "snapkv+think+kivi+h2o"])
def test_a_composition_has_two_or_three_named_parts(text):
    with pytest.raises(MethodError, match="a composition is an eviction method, think and/or a quantizer"):
        MethodSpec.parse(text).parts


@st.composite
def fractions(draw, removed: bool) -> tuple[str, str]:
    """(a fraction as written, canonical): decimals in [0, 1) for a removed fraction, (0, 1] for bytes."""
    digits = draw(st.integers(1, 9))
    numerator = draw(st.integers(0 if removed else 1, 10**digits - (1 if removed else 0)))
    exact = Decimal(numerator) / 10**digits
    canonical = format(exact.normalize(), "f")
    decimals = f"{exact:.{digits}f}"
    return draw(st.sampled_from([decimals, decimals + "0", decimals.lstrip("0") or "0"])), canonical


@st.composite
def user_budgets(draw) -> tuple[str, str]:
    kind = draw(st.sampled_from(["tokens", "r", "m"]))
    if kind == "tokens":
        tokens = draw(st.integers(1, 10**7))
        return draw(st.sampled_from([str(tokens), f"0{tokens}", f" {tokens} "])), str(tokens)
    as_written, canonical = draw(fractions(kind == "r"))
    return kind + as_written, kind + canonical


@settings(max_examples=300, deadline=None)
@given(user_budgets())
def test_a_parsed_budget_prints_in_its_canonical_spelling(case):
    text, canonical = case
    assert Budget.parse(text).spec == canonical


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.builds(Budget, st.just("tokens"), st.integers(1, 10**9)),
                 st.builds(Budget, st.just("ratio"), st.floats(0, 1, exclude_max=True)),
                 st.builds(Budget, st.just("memory"), st.floats(0, 1, exclude_min=True))))
def test_a_printed_budget_parses_back_to_itself(budget):
    assert Budget.parse(budget.spec) == budget
