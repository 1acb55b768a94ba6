"""docs/models.md's family x method table is the one scripts/write_family_table.py writes from the descriptions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import write_family_table  # noqa: E402
from kvmethods.core.catalog import BUILTINS  # noqa: E402

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


def test_the_family_table_in_the_docs_is_current():
    assert write_family_table.main(["--check"]) == 0, "run python scripts/write_family_table.py"


def test_the_table_counts_every_family_and_method():
    text = write_family_table.table()
    assert f"16 families x {len(BUILTINS)} built-in methods" in text
    assert "| deepseek_v3 |" in text and "| gemma2 | 1 global, 1 sliding |" in text
