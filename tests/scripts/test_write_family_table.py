"""docs/models.md's family x capability table is the one scripts/write_family_table.py writes from the descriptions."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import write_family_table  # noqa: E402
from kvmethods.core.capabilities import Capability  # noqa: E402
from kvmethods.core.catalog import BUILTINS  # noqa: E402
from kvmethods.core.family_table import layout_of  # noqa: E402
from kvmethods.core.layout import COMPRESS, KEEP, refusal  # noqa: E402
from kvmethods.testing import FAMILIES as TESTED, family_config  # noqa: E402

pytestmark = pytest.mark.transformers_independent  # tests/conftest.py: not rerun on transformers 5.2


def test_the_family_table_in_the_docs_is_current():
    assert write_family_table.main(["--check"]) == 0, "run python scripts/write_family_table.py"


def test_the_table_has_every_family_and_names_no_method():
    """Adding a method leaves docs/models.md as it is: the table names capabilities, not methods."""
    text = write_family_table.table()
    assert all(f"| {family} |" in text for family in TESTED) and "| gemma2 | 1 global, 1 sliding |" in text
    cells = [line.rsplit("|", 2)[-2] for line in text.splitlines() if line.startswith("| ")]
    assert not any(f" {name}," in cell or f" {name}:" in cell for name in BUILTINS for cell in cells)


@pytest.mark.parametrize("sliding", [KEEP, COMPRESS])
def test_a_method_is_refused_exactly_when_one_of_its_capabilities_in_the_table_is(sliding):
    """The capabilities the table asks cover every refusal of every built-in, on every family: what the table says
    of a capability is what a method declaring it meets."""
    for family in TESTED:
        layout = layout_of(family_config(family))
        refused = [flag for flag in write_family_table.REFUSABLE
                   if refusal(layout, write_family_table._asked(flag), sliding) is not None]
        for name, entry in BUILTINS.items():
            by_table = refusal(layout, Capability.COMPRESSES, sliding) is not None and bool(
                entry.capabilities & (Capability.COMPRESSES | Capability.OWN_STORAGE)) or any(
                flag in entry.capabilities and (flag == Capability.OWN_STORAGE or Capability.COMPRESSES in
                                                entry.capabilities) for flag in refused)
            assert by_table == (refusal(layout, entry.capabilities, sliding) is not None), (family, name, sliding)
