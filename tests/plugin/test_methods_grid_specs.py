"""The new method specs in the grid: wrappers by a string `base`, kvpress presses by name, nested TOML tables.

Collection only (no model loads): ids name what runs, and every bad spec is a one-line usage error.
"""

import importlib.util

import pytest

from helpers import GRID, collected_ids

HAS_KVPRESS = importlib.util.find_spec("kvpress") is not None
if HAS_KVPRESS:  # imported once here: in-process pytester runs would re-import torch.distributed through it
    import kvpress  # noqa: F401




def test_wrappers_and_new_methods_are_grid_items(bench):
    methods = "adakv:base=snapkv:window=16,criticalkv,expected_attention,kvzip:chunk_size=512,adakv:base=kvzip"
    result = bench.runpytest(*GRID, "--kvbench-methods", methods)
    assert result.ret == 0
    assert sorted(collected_ids(result)) == sorted([
        "adakv(base=snapkv,window=16)-64-passage_retrieval_en", "criticalkv-64-passage_retrieval_en",
        "expected_attention-64-passage_retrieval_en", "kvzip(chunk_size=512)-64-passage_retrieval_en",
        "adakv(base=kvzip)-64-passage_retrieval_en"])


def test_nested_toml_tables_become_dotted_parameters(bench):
    bench.makefile(".toml", grid='methods = [{name = "adakv", base = "criticalkv", window = 8}]\n')
    result = bench.runpytest(*GRID, "--kvbench-config", "grid.toml")
    assert collected_ids(result) == ["adakv(base=criticalkv,window=8)-64-passage_retrieval_en"]
    bench.makefile(".toml", grid='methods = [{name = "kvpress:AdaKVPress", press = {name = "SnapKVPress", '
                                 'window_size = 8}}]\n')
    result = bench.runpytest(*GRID, "--kvbench-config", "grid.toml")
    if HAS_KVPRESS:
        assert collected_ids(result) == [
            "kvpress:AdaKVPress(press=SnapKVPress,press.window_size=8)-64-passage_retrieval_en"]
    else:
        assert result.ret == pytest.ExitCode.USAGE_ERROR
        assert "kvpress:AdaKVPress needs the kvpress package" in result.stderr.str()


@pytest.mark.parametrize("methods, fragment", [
    ("adakv:base=streamingllm", "adakv: base 'streamingllm' cannot be wrapped"),
    ("adakv:base=nosuch", "unknown method 'nosuch'"),
    ("criticalkv:base=kvzip", "criticalkv: base 'kvzip' cannot be wrapped"),
    ("adakv:base=snapkv:windw=3", "snapkv: unknown parameter 'windw'"),
    pytest.param("kvpress:SnapKVPress", "needs the kvpress package, which is not installed: "
                 "pip install 'pytest-kvbench[kvpress]'",
                 marks=pytest.mark.skipif(HAS_KVPRESS, reason="kvpress is installed")),
    pytest.param("kvpress:NoSuchPress", "has no press 'NoSuchPress'",
                 marks=pytest.mark.skipif(not HAS_KVPRESS, reason="needs kvpress")),
    pytest.param("kvpress:AdaKVPress", "AdaKVPress wraps another press: add press=<PressName>",
                 marks=pytest.mark.skipif(not HAS_KVPRESS, reason="needs kvpress")),
])
def test_bad_specs_are_one_line_usage_errors_before_any_model_loads(bench, methods, fragment):
    result = bench.runpytest(*GRID, "--kvbench-methods", methods)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert fragment in err and "Traceback" not in err + result.stdout.str()
    assert len([line for line in err.splitlines() if line.startswith("ERROR")]) == 1


def test_item_ids_spell_specs_and_budgets_canonically(bench):
    """kvmethods.spec respells what the user wrote: values as the method coerces them (a composition's too),
    parts in role order, a ratio budget as a decimal that reads back (not r1e-05)."""
    methods = "snapkv:window=016,kivi+snapkv:bits=04,snapkv:per_turn=no"
    result = bench.runpytest(*GRID[:-4], "--kvbench-budgets", "r0.00001", "--kvbench-tasks", "passage_retrieval_en",
                             "--kvbench-methods", methods)
    assert result.ret == 0
    assert collected_ids(result) == ["snapkv(window=16)-r0.00001-passage_retrieval_en",
                                     "snapkv+kivi(bits=4)-r0.00001-passage_retrieval_en",
                                     "snapkv(per_turn=False)-r0.00001-passage_retrieval_en"]
