"""The mutation suite's data stays true to the code: every replacement of .ci/mutations.toml still matches its
file exactly once (a refactoring that moves the text makes a mutation stale, and a stale one tests nothing), and
the suite holds the kinds of bug issue 37 asks for."""

import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

ROOT = Path(__file__).resolve().parents[2]


def suite():
    spec = importlib.util.spec_from_file_location("ci_mutations", ROOT / ".ci" / "mutations.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_every_mutation_matches_its_file_exactly_once():
    module = suite()
    mutations = module.load_mutations(ROOT / ".ci" / "mutations.toml")
    assert module.check_edits(mutations, ROOT) == []
    assert all(m.edits and m.methods for m in mutations)


def test_the_suite_holds_the_kinds_of_bug_the_gate_must_catch():
    names = " / ".join(m.name for m in suite().load_mutations(ROOT / ".ci" / "mutations.toml"))
    for kind in ("pooling off", "half the observation window", "no sinks", "positions off", "one bit fewer",
                 "half the budget", "per-head budgets flattened", "last query", "first query", "reversed",
                 "previous sample's scores", "keys quantized per token", "longest row's position",
                 "padding mask off by one", "first row's sample"):
        assert kind in names, kind


def test_a_stale_mutation_is_named(tmp_path):
    module = suite()
    (tmp_path / "a.py").write_text("x = 1\nx = 1\n")
    stale = [module.Mutation("twice", [("a.py", "x = 1", "x = 2")], ["all"], []),
             module.Mutation("gone", [("a.py", "y = 1", "y = 2")], ["all"], [])]
    problems = module.check_edits(stale, tmp_path)
    assert len(problems) == 2 and "holds 2 copies" in problems[0] and "holds 0 copies" in problems[1]


def test_the_real_gate_arguments_come_from_its_script():
    module = suite()
    args = module.real_args()
    assert args[0] == "bench/test_ruler.py" and "--kvbench-compare" in args
    assert "results/baseline-real-smoke.json" in args and "--kvbench-methods" in args
    bf16 = module.real_args("real-bf16")
    assert "results/baseline-real-bf16.json" in bf16 and bf16[bf16.index("--kvbench-dtype") + 1] == "bfloat16"
    assert all((ROOT / baseline).is_file() for _, baseline in module.REAL_GATES.values())


def test_a_mutation_names_the_real_gates_it_needs(tmp_path):
    """`real = true` is the float32 SmolLM2 gate; a list names gates, so a bug of the bfloat16 decoding path runs
    the bfloat16 gate that alone can show it; every named gate exists."""
    module = suite()
    (tmp_path / "m.toml").write_text(
        '[[mutation]]\nname = "a"\nfile = "x.py"\nold = "1"\nnew = "2"\nreal = true\n'
        '[[mutation]]\nname = "b"\nfile = "x.py"\nold = "1"\nnew = "2"\nreal = ["real-bf16"]\n'
        '[[mutation]]\nname = "c"\nfile = "x.py"\nold = "1"\nnew = "2"\n')
    assert [m.real for m in module.load_mutations(tmp_path / "m.toml")] == [["real"], ["real-bf16"], []]
    listed = {gate for m in module.load_mutations(ROOT / ".ci" / "mutations.toml") for gate in m.real}
    assert "real-bf16" in listed and listed <= set(module.REAL_GATES)
    typo = module.Mutation("typo", [], ["all"], ["real-bf"])
    assert module.check_edits([typo], ROOT) == ["typo: real gate 'real-bf' is not one of ['real', 'real-bf16']"]


def test_a_gate_run_reports_its_exit_code_and_cpu_seconds(tmp_path):
    """The suite's cost is reported in CPU seconds per gate run (CI's budget is CPU-bound on 2 cores): measured as
    the gate process's own rusage, so it holds with two gates running at once."""
    module = suite()
    (tmp_path / "test_spin.py").write_text("def test_spin():\n    assert sum(i * i for i in range(2_000_000)) > 0\n")
    (tmp_path / "test_fails.py").write_text("def test_fails():\n    assert False\n")
    code, metrics, cpu = module.run_gate(ROOT, [str(tmp_path / "test_spin.py")], None, tmp_path)
    assert (code, metrics) == (0, []) and cpu > 0.05
    code, _, _ = module.run_gate(ROOT, [str(tmp_path / "test_fails.py")], None, tmp_path)
    assert code == 1


def test_mutated_gates_compare_with_the_baselines_saved_on_this_machine():
    """The exact checks (outputs, per-sample fidelity) hold only on the CPU model a baseline was saved on, so the
    suite compares mutated trees with copies it saved here first: each gate's --kvbench-compare is replaced by its
    copy, and a gate without a copy keeps the committed one (--committed)."""
    module = suite()
    mutation = module.Mutation("m", [], ["snapkv"], ["real-bf16"])
    gates = module.gates_of(mutation)
    assert [name for name, _ in gates][0] == "smoke" and [name for name, _ in gates][-1] == "real-bf16"
    copies = {"results/baseline-smoke.json": "/tmp/here/baseline-smoke.json"}
    smoke = module.against(gates[0][1], copies)
    assert smoke[smoke.index("--kvbench-compare") + 1] == "/tmp/here/baseline-smoke.json"
    assert smoke[:3] == ["bench/", "-m", "smoke"] and len(smoke) == len(gates[0][1])
    bf16 = module.against(gates[-1][1], copies)
    assert bf16 == gates[-1][1]
