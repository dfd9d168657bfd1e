"""``SQLiteStore.inspect``: the write probe, ``PRAGMA quick_check`` and the schema comparison.

The expected schema is built by running the packaged ``schema.sql`` in an in-memory database and
reading its ``sqlite_master``; the store's own ``sqlite_master`` is compared with it object by
object (statement text normalised for comments and whitespace, as the migration test does).
Objects whose name or table does not start with ``oncewire_`` are the application's own and are
left alone.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from urllib.parse import quote

from oncewire.core.errors import StorageError
from oncewire.storage.inspection import Inspection, SchemaDifference, WriteProbe
from oncewire.storage.sqlite import files
from oncewire.storage.sqlite.errors import translated
from oncewire.storage.sqlite.files import path_from_url
from oncewire.storage.sqlite.schema import SCHEMA_TABLE, fresh_schema, split_statements

__all__ = ["file_integrity", "inspect"]

QUICK_CHECK = "PRAGMA quick_check"

_PREFIX = "oncewire_"
_Master = dict[tuple[str, str], tuple[str, str | None]]  # (type, name) -> (table, sql)


def _normalise(sql: str | None) -> str | None:
    if sql is None:
        return None
    without_comments = re.sub(r"--[^\n]*", "", sql)
    text = re.sub(r"\s+", " ", without_comments).replace("( ", "(").replace(" )", ")")
    return text.strip()


def _master(conn: sqlite3.Connection) -> _Master:
    rows = conn.execute(
        "SELECT type, name, tbl_name, sql FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'"
    ).fetchall()
    return {
        (kind, name): (table, _normalise(sql))
        for kind, name, table, sql in rows
        if name.startswith(_PREFIX) or table.startswith(_PREFIX)
    }


def expected_master() -> _Master:
    """The objects a fresh install has, read back from SQLite itself."""
    memory = sqlite3.connect(":memory:")
    try:
        memory.execute(SCHEMA_TABLE)
        for statement in split_statements(fresh_schema()):
            memory.execute(statement)
        return _master(memory)
    finally:
        memory.close()


def compare(actual: _Master, expected: _Master) -> list[SchemaDifference]:
    differences = []
    for (kind, name), (table, sql) in sorted(expected.items()):
        if (kind, name) not in actual:
            differences.append(SchemaDifference(kind, name, "missing", f"on {table}"))
        elif actual[(kind, name)][1] != sql:
            differences.append(
                SchemaDifference(kind, name, "changed", "its definition is not schema.sql's")
            )
    for (kind, name), (table, _) in sorted(actual.items()):
        if (kind, name) not in expected:
            differences.append(SchemaDifference(kind, name, "extra", f"on {table}"))
    return differences


def _probe_write(conn: sqlite3.Connection) -> tuple[WriteProbe, str | None]:
    # BEGIN IMMEDIATE takes the write lock; a statement that would write (even one that matches
    # no row) is what a read-only file refuses. Nothing is changed: it is rolled back.
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("UPDATE oncewire_schema SET version = version WHERE 0")
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
    except sqlite3.Error as exc:
        code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
        probe = WriteProbe.BUSY if code in (5, 6) else WriteProbe.REFUSED  # BUSY, LOCKED
        return probe, str(translated("beginning a write transaction", exc))
    return WriteProbe.OK, None


def _integrity(conn: sqlite3.Connection) -> tuple[str, ...]:
    try:
        return files.integrity_problems(conn)
    except (sqlite3.Error, StorageError) as exc:  # busy throughout: the check did not run
        return (str(exc),)


def file_integrity(url: str) -> tuple[str, ...] | None:
    """``PRAGMA quick_check`` of a file that cannot be opened as a store (its schema is
    unreadable), read-only; None when the file cannot be opened at all."""
    path = str(Path(path_from_url(url)).resolve())
    snapshot = files.wal_index_missing(path) and files.read_only_cause(path) is not None
    immutable = "&immutable=1" if snapshot else ""  # no -shm can be created beside it
    try:
        conn = sqlite3.connect(f"file:{quote(path)}?mode=ro{immutable}", uri=True)
    except sqlite3.Error:
        return None
    try:
        return _integrity(conn)
    finally:
        conn.close()


def inspect(
    conn: sqlite3.Connection, integrity: tuple[str, ...] | None = None, path: str | None = None
) -> Inspection:
    """The inspection; ``integrity`` is what quick_check found while opening, if it ran."""
    probe, error = _probe_write(conn)
    cause = files.read_only_cause(path) if path and path != ":memory:" else None
    if probe is WriteProbe.REFUSED and cause:
        error = f"{error}: {cause}"  # which of the file, its directory or its mount
    if integrity is None:
        integrity = _integrity(conn)
    expected = expected_master()
    return Inspection(
        write=probe,
        write_error=error,
        integrity=integrity,
        integrity_check=QUICK_CHECK,
        objects=len(expected),
        differences=tuple(compare(_master(conn), expected)),
    )
