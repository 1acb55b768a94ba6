"""The record's schema version, and the migration of a record written by an older version.

Every record written carries ``schema_version``. A record is read through ``migrate`` before it is typed
(results/record/__init__.py, ``Record.from_json``), so runs, baselines and merges made by an older pytest-kvbench
load unchanged; a record of a newer version than this one knows is refused with one line.

Versions:
1. the untyped dict records, written before records were typed; they have no ``schema_version``.
2. typed records (``Record``): every part written whole (``latency``, ``memory``, ``fidelity``, ``device``
   and the model's fields are ``null`` where an item was skipped or errored, instead of absent);
   field names and meanings as in version 1.
3. the benchmark fingerprint: ``benchmark`` (task version, metric, generation settings) and, per sample,
   ``prompt_digest`` and ``output_digest`` (results/record/fingerprint.py). Older records have none
   (``benchmark: null``): a gate against them cannot tell a changed benchmark from a changed method, and says so.
"""

from __future__ import annotations

from collections.abc import Callable

SCHEMA_VERSION = 3
FIELD = "schema_version"
_DEFAULT_PROTOCOL = "question_in_window"


class RecordVersionError(ValueError):
    """A record whose schema version this pytest-kvbench cannot read; one line."""


def _from_1(record: dict) -> dict:
    """Version 1 -> 2. Version 1 writers left out what an item did not measure, and the first ones
    (before ``--kvbench-protocol``) wrote no protocol: every such run compressed the question with the
    context, which is ``question_in_window``. The parts a skipped item lacks take their empty value when
    the record is typed; nothing else changes meaning."""
    migrated = dict(record)
    migrated.setdefault("protocol", _DEFAULT_PROTOCOL)
    if migrated.get("protocol") is None:
        migrated["protocol"] = _DEFAULT_PROTOCOL
    migrated[FIELD] = 2
    return migrated


def _from_2(record: dict) -> dict:
    """Version 2 -> 3: no fingerprint was taken; ``benchmark`` is null (unknown), not made up."""
    migrated = dict(record)
    migrated.setdefault("benchmark", None)
    migrated[FIELD] = 3
    return migrated


_MIGRATIONS: dict[int, Callable[[dict], dict]] = {1: _from_1, 2: _from_2}  # version -> its step to the next version


def version_of(record: dict) -> int:
    """The record's schema version: its ``schema_version``, 1 when it has none."""
    version = record.get(FIELD, 1)
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise RecordVersionError(f"'{FIELD}' must be a positive integer, found {version!r}")
    return version


def migrate(record: dict) -> dict:
    """The record as the current version writes it (a new dict; the input is left as it was)."""
    version = version_of(record)
    if version > SCHEMA_VERSION:
        raise RecordVersionError(f"record schema version {version} was written by a newer pytest-kvbench "
                                 f"(this one reads versions 1 to {SCHEMA_VERSION}); upgrade pytest-kvbench")
    while version < SCHEMA_VERSION:
        record = _MIGRATIONS[version](record)
        version = version_of(record)
    return record
