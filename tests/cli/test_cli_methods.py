"""kvbench methods: every built-in method from the catalog, without torch."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvmethods.core.catalog import BUILTINS
from pytest_kvbench.cli import main

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2

ROOT = Path(__file__).resolve().parents[2]


def listed(capsys) -> list[dict]:
    assert main(["methods", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_every_builtin_is_listed_with_its_declared_parameters(capsys):
    rows = {row["name"]: row for row in listed(capsys)}
    assert sorted(rows) == sorted(BUILTINS)
    for name, entry in BUILTINS.items():
        assert [(p["name"], p["default"]) for p in rows[name]["params"]] == [(s.name, s.default) for s in entry.params]
        assert rows[name]["kvpress_press"] == (entry.kvpress_press or None)
    snapkv = {p["name"]: p for p in rows["snapkv"]["params"]}
    assert snapkv["kernel"]["range"] == ">= 1, odd" and snapkv["pooling"]["range"] == "avgpool|maxpool|none"
    assert {p["name"]: p["range"] for p in rows["h2o"]["params"]} == {"recent_ratio": "[0, 1]"}
    assert rows["snapkv"]["paper"] == "Li et al. 2024, SnapKV (arXiv 2404.14469)"
    assert all(row["paper"] for row in rows.values())


def test_kinds_and_refusing_families_come_from_the_capabilities(capsys):
    rows = {row["name"]: row for row in listed(capsys)}
    assert (rows["snapkv"]["kind"], rows["adakv"]["kind"], rows["kivi"]["kind"], rows["full"]["kind"],
            rows["streamingllm"]["kind"], rows["kvzip"]["kind"], rows["simlayerkv"]["kind"]) == (
        "scorer", "wrapper", "storage", "reference", "selector", "whole-prompt scorer", "per-layer selector")
    assert rows["snapkv"]["refused_by"] == {}
    assert "phi3" in rows["expected_attention"]["refused_by"] and "llama" not in rows["expected_attention"]["refused_by"]
    assert "pre-RoPE" in rows["expected_attention"]["refused_by"]["phi3"]
    assert set(rows["kvzip"]["refused_by"]) >= {"gemma2", "qwen3_next"}
    # adakv runs on gemma2 as it comes, not with its sliding layers compressed
    assert "gemma2" not in rows["adakv"]["refused_by"] and "gemma2" in rows["adakv"]["refused_with_sliding_compress"]


def test_the_table_names_every_method_and_its_refusing_families(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("| kvzip "))
    assert "gemma2" in line and "Kim et al. 2025" in line
    assert f"{len(BUILTINS)} built-in methods" in out


def test_listing_methods_imports_no_torch():
    code = ("import sys; from pytest_kvbench.cli import main; code = main(['methods']); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'torch imported'; "
            "sys.exit(code)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "| snapkv " in proc.stdout
