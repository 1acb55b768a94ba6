"""The pure parts of scripts/measure/compare_kvpress.py: its arguments, the method -> press mapping, answer matching.

The timing itself runs two environments and is reported, never asserted (docs/performance.md).
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "measure"))
import compare_kvpress as CK  # noqa: E402

from kvmethods import get_method  # noqa: E402
from pytest_kvbench.cases import MethodSpec  # noqa: E402


def test_defaults_are_the_issue_setting():
    args = CK.parse_args(["item"])
    assert (args.task, args.context_length, args.samples, args.threads, args.repeat) == ("niah_single_1", 2048, 10, 1, 3)
    assert CK.COMPARISONS["item"] == (["snapkv:window=64:kernel=5"], ["r0.9"])
    methods, budgets = CK.COMPARISONS["grid"]
    assert len(methods) == 8 and len(budgets) == 4


@pytest.mark.parametrize("argv", [[], ["items"], ["grid", "--repeat", "0"], ["item", "--samples", "-1"],
                                  ["item", "--threads", "x"]])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exited:
        CK.parse_args(argv)
    assert exited.value.code == 2 and "error:" in capsys.readouterr().err


def test_every_mapped_method_is_valid_and_its_kvpress_run_is_keyed_like_its_records():
    methods, budgets = CK.COMPARISONS["grid"]
    runs = CK.kvpress_runs(methods, budgets)
    assert len(runs) == 32
    for method in methods:
        spec = MethodSpec.parse(method)
        get_method(spec.name, **dict(spec.params))  # MethodError if the spec were wrong
    snapkv = runs[len(budgets) - 1]
    assert snapkv == {"key": "snapkv(kernel=5,window=64)|r0.9", "press": "SnapKVPress", "arguments": {}, "ratio": 0.9}
    assert [run["ratio"] for run in runs[:4]] == [0.25, 0.5, 0.75, 0.9]
    assert {run["key"]: run["arguments"] for run in runs if run["press"] == "CriticalKVPress"} == {
        f"{label}|{budget}": {"press": inner} for label, inner in [("criticalkv(kernel=5,window=64)", "SnapKVPress"),
                                                                   ("criticalkv(base=expected_attention)",
                                                                    "ExpectedAttentionPress")] for budget in budgets}


def test_pytest_arguments_run_the_reference_and_the_pipeline_protocol():
    args = CK.parse_args(["grid", "--samples", "4", "--context-length", "4096"])
    argv = CK.pytest_args(args, *CK.COMPARISONS["grid"])
    assert argv[argv.index("--kvbench-methods") + 1].split(",")[0] == "full"
    assert argv[argv.index("--kvbench-protocol") + 1] == "query_agnostic"
    assert argv[argv.index("--kvbench-samples") + 1] == "4"
    assert argv[argv.index("--kvbench-context-lengths") + 1] == "4096"


def test_agreement_counts_equal_answers_and_names_each_difference():
    ours = {"snapkv|r0.9": {"a": "123", "b": "45"}}
    theirs = {"snapkv|r0.9": {"a": "123", "b": "46"}, "tova|r0.9": {"a": "1"}}
    same, total, differ = CK.agreement(ours, theirs)
    assert (same, total) == (1, 3)
    assert differ == ["snapkv|r0.9 b: '45' | '46'", "tova|r0.9 a: None | '1'"]


PRESS_NAMES = {"window": "window_size", "kernel": "kernel_size", "sinks": "n_sink", "alpha": "alpha_safeguard"}


def test_mapped_settings_equal_the_presses_defaults():
    kvpress = pytest.importorskip("kvpress")
    for method, (press, arguments) in CK.METHOD_PRESSES.items():
        spec = MethodSpec.parse(method)
        ours = get_method(spec.name, **dict(spec.params)).params()
        presses = [*(value for value in arguments.values() if str(value).endswith("Press")), press]  # the wrapper's win
        theirs = {name: p.default for cls in presses for name, p in inspect.signature(getattr(kvpress, cls)).parameters.items()}
        theirs.update((name, value) for name, value in arguments.items() if not str(value).endswith("Press"))
        shared = {name: value for name, value in ours.items() if PRESS_NAMES.get(name, name) in theirs}
        assert shared or not ours, method
        assert {name: theirs[PRESS_NAMES.get(name, name)] for name in shared} == shared, method


def test_model_folder_and_protocol_reach_the_pytest_run():
    args = CK.parse_args(["scores", "--model", "/models/smollm2", "--budgets", "m0.125,m0.25"])
    argv = CK.pytest_args(args, ["snapkv"], ["m0.125"], "question_in_window")
    assert argv[argv.index("--kvbench-model") + 1] == "/models/smollm2"
    assert argv[argv.index("--kvbench-protocol") + 1] == "question_in_window"
    assert "--kvbench-model" not in CK.pytest_args(CK.parse_args(["item"]), ["snapkv"], ["r0.9"])


def test_the_scores_file_names_both_runs_and_holds_the_table(capsys):
    from pytest_kvbench.results.record import Record
    from pytest_kvbench.results.run.directories import Run, RunState
    from tests.test_cli_support import make_record

    def run(run_id, method, scores, packages):
        environment = {"git_commit": f"c-{run_id}", "command": "pytest bench/test_ruler.py", "python": "3.11",
                       "versions": {"transformers": "5.2.0"}, "packages": packages}
        return Run(run_id, Path("/r") / run_id, {"start": "2026-11-26T11:00", "environment": environment},
                   [Record.from_json(make_record(scores, method=method, budget="r0.9"))],
                   RunState(complete=True, has_run_file=True))

    ours = run("native", "snapkv", [1, 1, 0], {})
    theirs = run("pressed", "kvpress:SnapKVPress", [0, 0, 0], {"kvpress": "0.5.5"})
    command = "python scripts/measure/compare_kvpress.py scores --ours-run runs/a --kvpress-run runs/b --output K.md"
    text = CK.score_markdown("niah_single_1 at 2048 tokens", ours, theirs, command)
    assert f"Generated by `{command}`" in text and "clean tree" not in text  # the whole command, no "..."
    assert "- native: run `native` — 2026-11-26T11:00 — commit `c-native`. Made by" in text
    assert "- kvpress: run `pressed` — 2026-11-26T11:00 — commit `c-pressed` — kvpress 0.5.5." in text
    assert "| snapkv   | kvpress:SnapKVPress | r0.9" in text and "66.7 ± " in text
    theirs.info["environment"]["git_dirty"] = True
    text = CK.score_markdown("niah_single_1 at 2048 tokens", ours, theirs, command)
    assert "Not from a clean tree (kvpress run `pressed`: uncommitted changes)" in text
    with pytest.raises(SystemExit):
        CK.parse_args(["scores", "--output", "KVPRESS.md", "--ours-run", "runs/a"])
    assert "--output needs --ours-run and --kvpress-run" in capsys.readouterr().err
