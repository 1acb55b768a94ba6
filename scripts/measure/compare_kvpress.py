#!/usr/bin/env python
"""Our harness against NVIDIA kvpress's own pipeline doing the same compressed generation (issue 19's targets).

Users weigh a benchmark harness against running kvpress's pipeline themselves, so this times both on the same
work: the embedded model, a RULER task (niah_single_1 at 2,048 tokens, 10 samples), one torch thread, float32,
greedy decoding of the task's generation length, and the query_agnostic protocol, which is what kvpress's
pipeline does (the press compresses the context; the question is appended uncompressed).

- `item`: one SnapKV item at r0.9 (window 64, kernel 5: SnapKVPress's defaults) with its full-cache
  reference item, as `pytest` runs them, against kvpress's pipeline with SnapKVPress (target <= 1.3x).
- `grid`: 8 methods x 4 ratios plus the reference (33 items) against kvpress running the same 32
  (press, ratio) pairs (target <= 0.2x). METHOD_PRESSES maps each method to the press with equal settings.
- `scores`: not a timing: our native methods beside kvpress's presses run through our adapter
  (`kvpress:<Press>` methods, in kvpress's environment) on the same items (`--budgets`, the question_in_window
  protocol of the real-model job), each at its own defaults; prints the table of docs/real-model.md
  (pytest_kvbench/comparison/kvpress_scores.py). `--ours-run` / `--kvpress-run` reuse run directories instead of running.

`--model` runs any of them on a model folder (docs/real-model.md: SmolLM2-135M) instead of the embedded model.

Each side runs as a fresh subprocess timed from start to exit, so each pays its interpreter start, imports and
model load as a user does: ours is `python -m pytest bench/test_ruler.py ...` (collection, the run directory and
RESULTS.md included); kvpress's is scripts/measure/kvpress_pipeline_run.py in kvpress's environment (the model loaded
once for all its pairs). The prompts are made beforehand, untimed, with our RULER generator and handed to
kvpress as token ids split at the context length. Wall and CPU time (user + system of the child tree) are
reported, medians of interleaved rounds, with the load average; the answers of both sides are compared.

    python scripts/measure/compare_kvpress.py item --repeat 3
    python scripts/measure/compare_kvpress.py grid --repeat 3 --kvpress-python /work/venv-kvpress/bin/python
    python scripts/measure/compare_kvpress.py scores --model DIR --budgets m0.125 --samples 8 --ours-run RESULTS/runs/RUN
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

from common import Timing, print_medians, print_ratio, require_positive, timed_command, timed_pytest

from kvmethods.core.capabilities import Capability
from kvmethods.core.catalog import BASE, BUILTINS
from kvmethods.spec import MethodSpec
from pytest_kvbench.comparison.kvpress_scores import NATIVE_PRESSES, score_table
from pytest_kvbench.results.run.directories import load_run

# The methods timed against kvpress, each with the press its catalog row names (kvpress_press) at settings equal
# to the press's defaults (kvpress_defaults; a wrapper's base gets its own). Left out: pyramidkv and adakv
# (kvpress's PyramidKVPress and AdaKVPress fail in its pipeline on this model once a question of several tokens
# follows the compressed context: a mask sized for layer 0 / "Could not find fake keys"), h2o (kvpress has no
# press scoring the same). random: same cost; a different generator, so other positions and answers.
TIMED = ["snapkv", "streamingllm", "tova", "knorm", "expected_attention", "criticalkv",
         "criticalkv:base=expected_attention", "random"]


def _literal(value: str):
    """A press argument as the press takes it: a number stays a number, a press name a name."""
    try:
        return json.loads(value)
    except ValueError:
        return value


def kvpress_pair(method: str) -> tuple[str, tuple[str, dict]]:
    """Our spec at the press's defaults -> (kvpress press, its arguments; a press name builds that press with its
    defaults), from the catalog rows: `criticalkv` -> `criticalkv:window=64:kernel=5`, (CriticalKVPress,
    {press: SnapKVPress})."""
    spec = MethodSpec.parse(method)
    entry = BUILTINS[spec.name]
    press = MethodSpec.parse(entry.kvpress_press)
    arguments = {name: _literal(str(value)) for name, value in press.params}
    settings = [method] + ([entry.kvpress_defaults] if entry.kvpress_defaults else [])
    if Capability.WRAPS in entry.capabilities:
        base = BUILTINS[dict(spec.params).get(BASE, entry.default(BASE))]
        arguments["press"] = MethodSpec.parse(base.kvpress_press).name
        if base.kvpress_defaults and BASE not in dict(spec.params):
            settings.append(base.kvpress_defaults)
    return ":".join(settings), (press.name, arguments)


METHOD_PRESSES = dict(kvpress_pair(method) for method in TIMED)
COMPARISONS = {  # name -> (methods, ratio budgets)
    "item": (["snapkv:window=64:kernel=5"], ["r0.9"]),
    "grid": (list(METHOD_PRESSES), ["r0.25", "r0.5", "r0.75", "r0.9"]),
    "scores": (list(NATIVE_PRESSES), []),  # budgets from --budgets
}
PROTOCOL = "query_agnostic"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("comparison", choices=COMPARISONS)
    parser.add_argument("--repeat", type=int, default=3, help="interleaved rounds; medians are printed")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--task", default="niah_single_1", help="a RULER task")
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on both sides")
    parser.add_argument("--kvpress-python", default="/work/venv-kvpress/bin/python",
                        help="python of an environment with kvpress installed")
    parser.add_argument("--model", default=None, help="a model folder instead of the embedded model")
    parser.add_argument("--budgets", default="m0.125", help="scores: budgets, comma-separated")
    parser.add_argument("--ours-run", default=None, help="scores: a run directory holding our native rows")
    parser.add_argument("--kvpress-run", default=None, help="scores: a run directory holding the kvpress rows")
    parser.add_argument("--output", default=None,
                        help="scores: also write the table as markdown here, with both runs' provenance "
                             "(results/real/KVPRESS.md); needs --ours-run and --kvpress-run")
    args = parser.parse_args(argv)
    if args.output and not (args.ours_run and args.kvpress_run):
        parser.error("--output needs --ours-run and --kvpress-run (the runs it names)")
    require_positive(parser, args, ("repeat", "samples", "context_length", "threads"))
    return args


def kvpress_runs(methods: list[str], budgets: list[str]) -> list[dict]:
    """kvpress's (press, ratio) pairs for our (method, ratio budget) items, keyed as our records' labels."""
    from pytest_kvbench.cases import MethodSpec

    return [{"key": f"{MethodSpec.parse(method).label}|{budget}", "press": METHOD_PRESSES[method][0],
             "arguments": METHOD_PRESSES[method][1], "ratio": float(budget.removeprefix("r"))}
            for method in methods for budget in budgets]


def pytest_args(args: argparse.Namespace, methods: list[str], budgets: list[str],
                protocol: str = PROTOCOL) -> list[str]:
    model = ["--kvbench-model", args.model] if args.model else []
    return ["bench/test_ruler.py", *model, "--kvbench-methods", ",".join(["full", *methods]),
            "--kvbench-budgets", ",".join(budgets), "--kvbench-tasks", args.task,
            "--kvbench-context-lengths", str(args.context_length), "--kvbench-samples", str(args.samples),
            "--kvbench-torch-threads", str(args.threads), "--kvbench-protocol", protocol]


def prompts(args: argparse.Namespace) -> tuple[list[dict], int, str]:
    """Our prompts for the task, split at the context length; the generation length; the model directory."""
    from transformers import AutoConfig, AutoTokenizer

    from pytest_kvbench.engine.models import DEFAULT_MODEL_DIR
    from pytest_kvbench.tasks import get_task

    model_dir = args.model or str(DEFAULT_MODEL_DIR)
    tokenizer, task = AutoTokenizer.from_pretrained(model_dir), get_task(args.task)
    max_prompt = AutoConfig.from_pretrained(model_dir).max_position_embeddings - task.max_new_tokens
    out = []
    for sample in task.load_samples(tokenizer, n=args.samples, seed=0, data_dir="fixtures",
                                    context_length=args.context_length):
        prompt = task.build_prompt(sample, tokenizer, max_prompt)
        out.append({"id": sample.id, "context_ids": prompt.input_ids[:prompt.context_len],
                    "question_ids": prompt.input_ids[prompt.context_len:]})
    return out, task.max_new_tokens, model_dir


def our_answers(records: list) -> dict[str, dict[str, str]]:
    return {f"{r.labels.method}|{r.labels.budget}": {s["id"]: s["prediction"] for s in r.samples} for r in records}


def time_split(records: list, kvpress_out: dict, ours: Timing, theirs: Timing) -> list[str]:
    """Where each side's wall time went in the last round: the items / pipeline calls, and the rest (start-up,
    imports, model load, collection, writing the run); ours split further by the records' labelled parts."""
    samples = [sample for record in records for sample in record.samples]
    forward: dict[str, float] = {}
    for sample in samples:  # the shared forward is spent once per sample, whichever item ran it
        forward[sample["id"]] = max(forward.get(sample["id"], 0.0), sample["shared_prefill_ms"] or 0.0)
    items = sum(record.latency.total_s for record in records)
    parts = {"model load": sum(r.model.load_s for r in records if r.model.loaded_by_this_item),
             "prefill forward": sum(forward.values()) / 1000,
             "selections": sum(sample["compression_ms"] or 0.0 for sample in samples) / 1000,
             "decoding": sum(sample["decode_ms"] for sample in samples) / 1000}
    calls = sum(kvpress_out["seconds"].values())
    return [f"ours, last round: items {items:.1f} s of {ours.wall_s:.1f} s wall ("
            + ", ".join(f"{name} {value:.1f} s" for name, value in parts.items())
            + f", the rest of the items {items - sum(parts.values()):.1f} s: fidelity, scores, records)",
            f"kvpress, last round: pipeline calls {calls:.1f} s of {theirs.wall_s:.1f} s wall"]


def agreement(ours: dict[str, dict[str, str]], theirs: dict[str, dict[str, str]]) -> tuple[int, int, list[str]]:
    """Answers equal on both sides, answers compared, and where they differ ('key sample: ours | theirs')."""
    same, differ = 0, []
    for key, answers in theirs.items():
        for sample, answer in answers.items():
            mine = ours.get(key, {}).get(sample)
            if mine == answer:
                same += 1
            else:
                differ.append(f"{key} {sample}: {mine!r} | {answer!r}")
    return same, same + len(differ), differ


def run_records(run_dir: str | None, python: str, pytest_argv: list[str]) -> list:
    """The records of a given run directory, or of a fresh pytest run with `python` (untimed)."""
    return load_run(run_dir).records if run_dir else timed_pytest(pytest_argv, python)[1]


def score_markdown(title: str, ours, theirs, command: str) -> str:
    """The side-by-side table as a file: the full command that wrote it, and which runs (id, date, commit, command,
    versions) made each side; a run made from a tree with uncommitted changes is named as one to remake."""
    from pytest_kvbench.results.views.tables import provenance

    def side(name: str, run) -> str:
        kvpress = (run.environment.get("packages") or {}).get("kvpress")
        return (f"- {name}: run `{run.run_id}` — {run.info.get('start', '')} — commit `{run.commit or 'n/a'}`"
                f"{f' — kvpress {kvpress}' if kvpress else ''}. {provenance(run.environment)}")

    dirty = [f"{name} run `{run.run_id}`" for name, run in (("native", ours), ("kvpress", theirs))
             if run.environment.get("git_dirty")]
    remake = ([f"Not from a clean tree ({' and '.join(dirty)}: uncommitted changes): remake the run(s) from a clean "
               "checkout, then this file.", ""] if dirty else [])
    return "\n".join([
        "# Native methods beside kvpress's presses (same items)", "",
        f"Generated by `{command}`", "",
        *remake,
        "From the two runs below; each",
        "native method is paired with the press that implements it, each at its own defaults",
        "(pytest_kvbench/comparison/kvpress_scores.py). `kvpress - native`: the paired difference over the samples both ran,",
        "with its 95% bootstrap interval; `> 1 CI`: larger than the wider row's half-width. The differences are",
        "explained in docs/real-model.md.", "",
        side("native", ours), side("kvpress", theirs), "", title, "",
        score_table(ours.records, theirs.records), ""])


def compare_scores(args: argparse.Namespace, argv: list[str] | None = None) -> None:
    """Native rows and kvpress rows on the same items, side by side (kvpress_score_table.py)."""
    budgets = [b.strip() for b in args.budgets.split(",") if b.strip()]
    protocol = "question_in_window"  # the real-model job's
    ours = run_records(args.ours_run, sys.executable, pytest_args(args, list(NATIVE_PRESSES), budgets, protocol))
    theirs = run_records(args.kvpress_run, args.kvpress_python,
                         pytest_args(args, list(NATIVE_PRESSES.values()), budgets, protocol))
    title = (f"{args.task} at {args.context_length} tokens, {protocol}, model {args.model or 'embedded'}; "
             "mean ± 95% bootstrap half-width over the samples both sides ran (score x 100)")
    print(title)
    print(score_table(ours, theirs))
    if args.output:
        command = shlex.join(["python", "scripts/measure/compare_kvpress.py", *(argv if argv is not None else sys.argv[1:])])
        Path(args.output).write_text(score_markdown(title, load_run(args.ours_run), load_run(args.kvpress_run), command))
        print(f"written: {args.output}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.comparison == "scores":
        return compare_scores(args, argv)
    methods, budgets = COMPARISONS[args.comparison]
    ours_name, theirs_name = f"ours: pytest, {len(methods) * len(budgets) + 1} items", \
        f"kvpress pipeline, {len(methods) * len(budgets)} pairs"
    timings: dict[str, list[Timing]] = {ours_name: [], theirs_name: []}
    with tempfile.TemporaryDirectory() as work:
        job, answers = Path(work) / "job.json", Path(work) / "answers.json"
        samples, max_new_tokens, model_dir = prompts(args)
        job.write_text(json.dumps({"model_dir": model_dir, "threads": args.threads, "max_new_tokens": max_new_tokens,
                                   "prompts": samples, "runs": kvpress_runs(methods, budgets)}))
        for _ in range(args.repeat):
            timing, records = timed_pytest(pytest_args(args, methods, budgets))
            timings[ours_name].append(timing)
            timings[theirs_name].append(timed_command([args.kvpress_python, "scripts/measure/kvpress_pipeline_run.py",
                                                       str(job), str(answers)]))
        kvpress_out = json.loads(answers.read_text())
        same, total, differ = agreement(our_answers(records), kvpress_out["answers"])
    print(f"{args.comparison}: {args.task} at {args.context_length} tokens, {args.samples} samples, "
          f"{args.threads} thread(s), {PROTOCOL}; rounds: {args.repeat}")
    print("ours: pytest " + " ".join(pytest_args(args, methods, budgets)))
    ours, theirs = print_medians(timings).values()
    print_ratio("ours / kvpress", ours, theirs)
    print("\n".join(time_split(records, kvpress_out, timings[ours_name][-1], timings[theirs_name][-1])))
    print(f"answers equal: {same} of {total}")
    print("\n".join(differ[:20]))


if __name__ == "__main__":
    main()
