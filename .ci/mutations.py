#!/usr/bin/env python
"""The mutation suite of the regression gates: each bug of .ci/mutations.toml applied to a copy of the tree, the
CI gate commands run against it, and the gates must FAIL (issue 37 item 3); the unmodified tree must pass.

The gates are the commands .ci/run runs: the smoke gate (`pytest bench/ -m smoke --kvbench-compare
results/baseline-smoke.json`), the gate configs (bench/configs/gate-NAME.toml against results/baseline-NAME.json:
the methods, budget kind and protocols the smoke grid leaves out) and, for a mutation of one of its methods that the
smoke gate missed, the real-model gates it names (REAL_GATES: .ci/real-model.sh's SmolLM2 commands), each restricted
with -k to the items the mutation can move. One copy of the tree per parallel job is prepared once and reused: a mutation is applied,
the gates run with PYTHONPATH on the copy, the file is put back. A mutation is caught when a gate exits 1 (an
item failed its verdict, or errored); the metrics that failed are read from the gated run's records.

The mutated gates compare against baselines saved on this machine (fingerprint_here): a gate holds outputs and each
sample's fidelity to rounding only on the CPU model its baseline was saved on, and CI draws whichever machine.

    python .ci/mutations.py [--jobs 2] [--control N] [--only NAME,...] [--report FILE] [--target 0.9] [--committed]

Exit 0 when at least `target` of the mutations are caught and every control run (the unmodified tree, the full
gates, N times) passed; 1 otherwise; 2 for a mutation whose text no longer matches its file.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ["bench/", "-m", "smoke", "--kvbench-compare", "results/baseline-smoke.json"]
GATE_CONFIGS = "bench/configs/gate-*.toml"  # the gates beside the smoke gate that cover the rest of the product


def config_gates() -> list[tuple[str, list[str]]]:
    """Each bench/configs/gate-NAME.toml as .ci/run runs it: its grid against results/baseline-NAME.json."""
    gates = []
    for config in sorted(ROOT.glob(GATE_CONFIGS)):
        name = config.stem.removeprefix("gate-")
        gates.append((name, ["bench/test_ruler.py", "--kvbench-config", str(config.relative_to(ROOT)),
                             "--kvbench-compare", f"results/baseline-{name}.json"]))
    return gates
FAILING = ("regression", "changed")


@dataclass
class Mutation:
    name: str
    edits: list[tuple[str, str, str]]
    methods: list[str]
    real: list[str]  # the real-model gates (REAL_GATES) to run when the others miss it


@dataclass
class Outcome:
    name: str
    caught_by: str = ""  # "smoke" | a gate config's name | a real gate's name | "" (missed)
    metrics: list[str] = field(default_factory=list)
    seconds: float = 0.0
    cpu: float = 0.0  # CPU seconds of its gate runs (user + system, the pytest processes and their children)
    detail: str = ""


def load_mutations(path: Path) -> list[Mutation]:
    data = tomllib.loads(path.read_text())
    mutations = []
    for row in data["mutation"]:
        edits = [(e["file"], e["old"], e["new"]) for e in row.get("edits", [])]
        if "file" in row:
            edits.insert(0, (row["file"], row["old"], row["new"]))
        real = row.get("real", False)  # true: the float32 real gate; or a list of REAL_GATES names
        real = ["real"] if real is True else [real] if isinstance(real, str) else list(real or [])
        mutations.append(Mutation(row["name"], edits, list(row.get("methods", ["all"])), real))
    return mutations


def check_edits(mutations: list[Mutation], root: Path) -> list[str]:
    """Every `old` must occur exactly once in its file (a refactoring that moved it makes the mutation stale), and
    every real gate a mutation names must be one of REAL_GATES (a typo would fail the suite halfway through)."""
    problems = []
    for mutation in mutations:
        for gate in mutation.real:
            if gate not in REAL_GATES:
                problems.append(f"{mutation.name}: real gate {gate!r} is not one of {sorted(REAL_GATES)}")
        for file, old, _ in mutation.edits:
            text = (root / file).read_text()
            if text.count(old) != 1:
                problems.append(f"{mutation.name}: {file} holds {text.count(old)} copies of {old!r} (expected 1)")
    return problems


# The SmolLM2 gates of .ci/real-model.sh: name -> (its shell variable there, its baseline). The gemma3-270m gate
# ($HYBRID, ~2 min) is left to .ci/run: no mutation here needs a sliding-window model to show.
REAL_GATES = {"real": ("ARGS", "results/baseline-real-smoke.json"),
              "real-bf16": ("BF16", "results/baseline-real-bf16.json")}


def real_args(gate: str = "real") -> list[str]:
    """A real-model gate's arguments, read from .ci/real-model.sh (one place says what that gate runs)."""
    variable, baseline = REAL_GATES[gate]
    text = (ROOT / ".ci" / "real-model.sh").read_text()
    raw = re.search(rf'^{variable}="(.*?)"', text, re.S | re.M).group(1)
    raw = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: os.environ.get(m[1], m[2]), raw)
    return ["bench/test_ruler.py", *raw.split(), "--kvbench-compare", baseline]


def prepare_tree(target: Path) -> Path:
    """A copy of the working tree (tracked and untracked files git does not ignore)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def failing_metrics(results: Path) -> list[str]:
    metrics = set()
    for records in results.glob("runs/*/records.jsonl"):
        for line in records.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("status") in ("error", "failed") and not record.get("verdict"):
                metrics.add("error")
            for check in (record.get("verdict") or {}).get("checks") or []:
                if check.get("status") in FAILING:
                    metrics.add(check["metric"])
            if (record.get("verdict") or {}).get("status") in ("mismatch", "benchmark"):  # benchmark: its fingerprint
                metrics.add((record.get("verdict") or {})["status"])
    return sorted(metrics)


def run_gate(tree: Path, args: list[str], select: str | None, scratch: Path) -> tuple[int, list[str], float]:
    """One gate command on `tree`: (exit code, metrics that failed, CPU seconds it took). The CPU time is the
    child's own rusage (os.wait4), so it holds with several gates running at once (--jobs)."""
    results = Path(tempfile.mkdtemp(dir=scratch))
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "--kvbench-results", str(results)]
    if select:
        command += ["-k", select]
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    with open(results.with_suffix(".log"), "w") as log:  # the gate's output, beside its results
        proc = subprocess.Popen(command, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, failing_metrics(results), usage.ru_utime + usage.ru_stime


def gates_of(mutation: Mutation) -> list[tuple[str, list[str]]]:
    """The gates a mutation goes through, in order: smoke, each gate config, then the real gates it names."""
    return [("smoke", SMOKE), *config_gates(), *((gate, real_args(gate)) for gate in mutation.real)]


def baseline_of(args: list[str] | tuple[str, ...]) -> str:
    """The baseline a gate compares with (the value of its --kvbench-compare)."""
    return args[args.index("--kvbench-compare") + 1]


def against(args: list[str], baselines: dict[str, str]) -> list[str]:
    """A gate's arguments with its --kvbench-compare baseline replaced by this machine's copy (fingerprint_here)."""
    at = args.index("--kvbench-compare") + 1
    return [*args[:at], baselines.get(args[at], args[at]), *args[at + 1:]]


def unmodified(name: str, codes: list[tuple[int, list[str], float]], started: float) -> Outcome:
    """The outcome of unmodified gate runs: ``FALSE ALARM`` with the failing metrics where any failed."""
    failed = [m for code, metrics, _ in codes if code != 0 for m in metrics or [f"exit {code}"]]
    return Outcome(name, "FALSE ALARM" if failed else "", failed, time.monotonic() - started,
                   sum(cpu for _, _, cpu in codes), ", ".join(f"exit {code}" for code, _, _ in codes))


def fingerprint_here(mutations: list[Mutation], trees: list[Path], scratch: Path) -> tuple[dict[str, str], Outcome]:
    """Each gate's baseline saved again from the unmodified tree on this machine: (committed path -> saved copy,
    the runs' outcome: ``FALSE ALARM`` where an unmodified gate failed its committed baseline).

    Why: where a run is deterministic (the CPU model, torch and threads of the baseline's ``outputs_on``) a gate
    holds the full-cache reference's outputs, a seeded method's outputs and each sample's fidelity to float
    rounding; on another CPU model only within the statistical tolerances (docs/baselines.md). Some bugs of the
    suite (a metric read as match-any, a seeded method drawing from the global RNG, ...) show only there. CI draws
    whichever machine, and the suite measures what the gates can catch, not which machine CI drew: so the mutated
    trees are compared with baselines of the machine they run on. The same runs compare the unmodified tree with
    the committed baselines, so they are a control run too."""
    started = time.monotonic()
    gates = list(dict.fromkeys(tuple(args) for mutation in mutations for _, args in gates_of(mutation)))
    (scratch / "baselines").mkdir()
    baselines = {baseline_of(args): str(scratch / "baselines" / Path(baseline_of(args)).name) for args in gates}

    def save(job: tuple[int, tuple[str, ...]]) -> tuple[int, list[str], float]:
        index, args = job
        return run_gate(trees[index % len(trees)], [*args, "--kvbench-save", baselines[baseline_of(args)]], None,
                        scratch)

    with ThreadPoolExecutor(max_workers=len(trees)) as pool:
        codes = list(pool.map(save, enumerate(gates)))
    return baselines, unmodified("unmodified, baselines saved here", codes, started)


def selection(mutation: Mutation) -> str | None:
    return None if "all" in mutation.methods else " or ".join(mutation.methods)


def try_mutation(mutation: Mutation, tree: Path, scratch: Path, baselines: dict[str, str] | None = None) -> Outcome:
    outcome = Outcome(mutation.name)
    originals = {file: (tree / file).read_text() for file, _, _ in mutation.edits}
    started = time.monotonic()
    try:
        for file, old, new in mutation.edits:
            path = tree / file
            path.write_text(path.read_text().replace(old, new, 1))
        notes = []
        for gate, args in gates_of(mutation):
            code, metrics, cpu = run_gate(tree, against(args, baselines or {}), selection(mutation), scratch)
            outcome.cpu += cpu
            notes.append(f"{gate}: exit {code}")
            if code not in (0, 5):  # 5: the selection holds none of this gate's items
                outcome.caught_by, outcome.metrics = gate, metrics
                break
        outcome.detail = ", ".join(notes)
    finally:
        for file, text in originals.items():
            (tree / file).write_text(text)
    outcome.seconds = time.monotonic() - started
    return outcome


def control(tree: Path, scratch: Path) -> Outcome:
    """The unmodified tree through every whole gate (smoke, the gate configs, the real gates): must pass."""
    started = time.monotonic()
    codes = [run_gate(tree, args, None, scratch)
             for args in (SMOKE, *(a for _, a in config_gates()), *map(real_args, REAL_GATES))]
    return unmodified("unmodified", codes, started)


def table(outcomes: list[Outcome]) -> str:
    lines = ["| mutation | caught by | failing metrics | wall s | CPU s |", "|---|---|---|---|---|"]
    for o in outcomes:
        verdict = o.caught_by or ("passed (no false alarm)" if o.name.startswith("unmodified") else "**missed**")
        lines.append(f"| {o.name} | {verdict} | {', '.join(o.metrics) or '-'} | {o.seconds:.0f} "
                     f"| {o.cpu:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="mutations tried at once (one tree copy each)")
    parser.add_argument("--control", type=int, default=0, help="unmodified runs of both whole gates (must pass)")
    parser.add_argument("--only", default="", help="comma-separated mutation names (substrings)")
    parser.add_argument("--report", help="write the markdown table here too")
    parser.add_argument("--target", type=float, default=0.9, help="least fraction of mutations caught")
    parser.add_argument("--committed", action="store_true",
                        help="compare the mutated gates with the committed baselines, not with copies saved on "
                             "this machine first (the gates as CI runs them: exact checks only on the baselines' "
                             "CPU model)")
    args = parser.parse_args(argv)
    mutations = load_mutations(ROOT / ".ci" / "mutations.toml")
    problems = check_edits(mutations, ROOT)
    if problems:
        print("mutations: stale entries in .ci/mutations.toml:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    if args.only:
        wanted = [w.strip() for w in args.only.split(",")]
        mutations = [m for m in mutations if any(w in m.name for w in wanted)]
    scratch = Path(tempfile.mkdtemp(prefix="kvbench-mutations-"))
    started = time.monotonic()
    try:
        trees = [prepare_tree(scratch / f"tree{j}") for j in range(max(1, args.jobs))]
        baselines, fingerprinted = {}, []
        if not args.committed:
            baselines, saved = fingerprint_here(mutations, trees, scratch)
            fingerprinted = [saved]
            print(f"baselines saved on this machine ({saved.detail}; {saved.seconds:.0f} s, {saved.cpu:.0f} CPU s)"
                  + (f": FALSE ALARM {saved.metrics}" if saved.caught_by else ""), flush=True)
            if saved.caught_by:  # the unmodified tree fails a gate: no mutation can be judged against it
                mutations = []
        free = list(trees)
        lock = threading.Lock()

        def work(mutation: Mutation) -> Outcome:
            with lock:
                tree = free.pop()
            try:
                outcome = try_mutation(mutation, tree, scratch, baselines)
            finally:
                with lock:
                    free.append(tree)
            print(f"mutation {outcome.name}: {outcome.caught_by or 'MISSED'} {outcome.metrics} "
                  f"({outcome.detail}; {outcome.seconds:.0f} s, {outcome.cpu:.0f} CPU s)", flush=True)
            return outcome

        with ThreadPoolExecutor(max_workers=len(trees)) as pool:
            outcomes = list(pool.map(work, mutations))
        controls = fingerprinted + [control(trees[0], scratch) for _ in range(args.control)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    caught = sum(bool(o.caught_by) for o in outcomes)
    alarms = sum(bool(c.caught_by) for c in controls)
    text = table(outcomes + controls) + (
        f"\n\n{caught} of {len(outcomes)} mutations caught; {alarms} false alarms in {len(controls)} unmodified runs; "
        f"{time.monotonic() - started:.0f} s wall with {len(trees)} job(s); mutations {sum(o.cpu for o in outcomes):.0f} "
        f"CPU s, control runs {sum(c.cpu for c in controls):.0f} CPU s")
    print(text)
    if args.report:
        Path(args.report).write_text(text + "\n")
    return 0 if outcomes and caught >= args.target * len(outcomes) and not alarms else 1


if __name__ == "__main__":
    sys.exit(main())
