"""Reading benchmark records from where they live: packaged fixtures, a local directory, the hub.

Every suite ships a few fixture records in its official file format under
``pytest_kvbench/data/<suite>/``, reads the same format from ``--kvbench-data DIR`` (the file
either in ``DIR/<suite>/`` or directly in ``DIR``), and otherwise loads the hub dataset through
``datasets``. Records come out as ``(where, record)`` pairs, ``where`` being ``file:line`` (or
``hub:repo/config:row``), so a malformed record is reported as a DataError naming its place.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from .errors import DataError, TaskUnavailable

DATA_ROOT = Path(__file__).resolve().parent.parent / "data"
FIXTURES = "fixtures"

Validator = Callable[[Any, str], dict]


def is_fixture_dir(data_dir) -> bool:
    """``data_dir`` is the word "fixtures" or a packaged fixture folder (``data/`` or ``data/<suite>``:
    naming the LongBench one, as older callers do, means the fixtures of every suite)."""
    if data_dir is None:
        return False
    if str(data_dir) == FIXTURES:
        return True
    try:
        resolved = Path(data_dir).resolve()
    except (OSError, ValueError):  # unreadable, or not a path at all (a NUL byte): the data checks name it
        return False
    return resolved == DATA_ROOT or resolved.parent == DATA_ROOT


def take(records: Iterable[tuple[str, dict]], n: int | None) -> Iterator[tuple[str, dict]]:
    for count, item in enumerate(records):
        if n is not None and count >= n:
            return
        yield item


def parse_line(text: str | bytes, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise DataError(f"{where}: not valid JSON ({error.msg} at column {error.colno})") from None


def read_jsonl(path: Path, validate: Validator) -> Iterator[tuple[str, dict]]:
    """One record per non-blank line, each checked by ``validate(record, "file:line")``."""
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if line.strip():
                where = f"{path}:{line_number}"
                yield where, validate(parse_line(line, where), where)


def read_json_array(path: Path, validate: Validator) -> Iterator[tuple[str, dict]]:
    """A file holding one JSON array of records; each record's place is the line it starts on."""
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    position = _skip_space(text, 0)
    if not text.startswith("[", position):
        raise DataError(f"{path}:{text.count(chr(10), 0, position) + 1}: expected a JSON array of records")
    position = _skip_space(text, position + 1)
    if text.startswith("]", position):
        return
    while True:
        where = f"{path}:{text.count(chr(10), 0, position) + 1}"
        try:
            record, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as error:
            raise DataError(f"{path}:{error.lineno}: not valid JSON ({error.msg} at column {error.colno})") from None
        yield where, validate(record, where)
        position = _skip_space(text, position)
        if text.startswith("]", position):
            return
        if not text.startswith(",", position):
            raise DataError(f"{path}:{text.count(chr(10), 0, position) + 1}: expected ',' or ']' between records")
        position = _skip_space(text, position + 1)


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position].isspace():
        position += 1
    return position


def local_file(data_dir: Path, suite: str, filename: str, how_to_get: str) -> Path:
    """``DIR/<suite>/<filename>`` or ``DIR/<filename>``; TaskUnavailable naming both when neither exists."""
    candidates = (data_dir / suite / filename, data_dir / filename)
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise TaskUnavailable(f"neither {candidates[0]} nor {candidates[1]} exists; {how_to_get}")


def hub_rows(hub: dict, validate: Validator, how_to_get: str) -> Iterator[tuple[str, dict]]:
    """Rows of a hub dataset through ``datasets`` (cached by it): ``hub`` holds the arguments of
    ``load_dataset`` (path, name, split, data_files). TaskUnavailable when it cannot load."""
    label = "/".join(str(hub[key]) for key in ("path", "name", "data_files") if hub.get(key))
    try:
        # lazy for startup time: datasets (pyarrow, pandas)
        from datasets import load_dataset

        rows = load_dataset(**hub)
    except Exception as error:  # offline, not cached, network errors, format changes
        raise TaskUnavailable(
            f"datasets could not load {label} ({type(error).__name__}: {error}); {how_to_get}"
        ) from None
    for row_number, row in enumerate(rows):
        where = f"hub:{label}:{row_number}"
        yield where, validate(dict(row), where)


def require_fields(record: Any, where: str, fields: dict[str, type | tuple[type, ...]]) -> dict:
    """DataError unless ``record`` is an object with every named field of the named type."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
    for name, expected in fields.items():
        if name not in record:
            raise DataError(f"{where}: missing field {name!r}")
        value = record[name]
        if not isinstance(value, expected) or isinstance(value, bool):
            wanted = expected.__name__ if isinstance(expected, type) else " or ".join(t.__name__ for t in expected)
            raise DataError(f"{where}: field {name!r} must be {wanted}, got {type(value).__name__}")
    return record


def sample_id(record: dict, task: str, where: str, key: str = "_id") -> str:
    """The record's own id when it has one, else ``task:<line or row>`` (stable for a given file)."""
    own = record.get(key)
    return str(own) if own is not None and own != "" else f"{task}:{where.rsplit(':', 1)[-1]}"


class SuiteData:
    """Where one suite's records come from: fixture folder, local file name, hub dataset."""

    def __init__(self, suite: str, how_to_get: str, reader=read_jsonl) -> None:
        self.suite = suite
        self.fixture_dir = DATA_ROOT / suite
        self.how_to_get = how_to_get
        self.reader = reader

    def fixture_files(self) -> list[str]:
        return sorted(path.name for path in self.fixture_dir.glob("*.json*"))

    def records(self, filename: str, validate: Validator, data_dir=None, n: int | None = None,
                hub: dict | None = None) -> list[tuple[str, dict]]:
        """The first ``n`` records (all when None) of ``filename``, in file order; ``hub`` holds
        the ``load_dataset`` arguments used when no ``data_dir`` is given."""
        how = self.how_to_get.format(file=filename)
        if is_fixture_dir(data_dir):
            path = self.fixture_dir / filename
            if not path.is_file():
                raise TaskUnavailable(
                    f"no packaged {self.suite} fixture {filename} (fixtures: {', '.join(self.fixture_files())}); {how}"
                )
            return list(take(self.reader(path, validate), n))
        if data_dir is not None:
            return list(take(self.reader(local_file(Path(data_dir), self.suite, filename, how), validate), n))
        if hub is None:
            raise TaskUnavailable(f"{self.suite} {filename} has no hub copy; {how}")
        return list(take(hub_rows(hub, validate, how), n))
