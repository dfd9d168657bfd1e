"""The SQLite schema: its version table, the packaged migrations and how they run.

Migrations run statement by statement inside one ``BEGIN IMMEDIATE`` transaction (SQLite's
write lock, so several processes opening one file at once take turns), through the shared
runner (:mod:`oncewire.storage.migrate`). :func:`fresh_schema` is the schema a new store gets,
which the inspection (:mod:`~oncewire.storage.sqlite.inspect`) compares a store with.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator

from oncewire.core.errors import SchemaError
from oncewire.storage import migrate as runner
from oncewire.storage.sqlite.errors import translate_errors

__all__ = [
    "DIALECT",
    "SCHEMA_TABLE",
    "current_version",
    "fresh_schema",
    "migrate",
    "migrations",
    "split_statements",
    "version_and_tables",
]

_PACKAGE = "oncewire.storage.sqlite"

SCHEMA_TABLE = """
CREATE TABLE IF NOT EXISTS oncewire_schema (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at REAL NOT NULL
)"""


def split_statements(script: str) -> list[str]:
    """Split a script into complete statements (so they can run inside our own transaction)."""
    statements, buffer = [], ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip() and not all(
        part.strip().startswith("--") or not part.strip() for part in buffer.splitlines()
    ):
        raise SchemaError("a schema file ends in an incomplete statement")
    return statements


def current_version(conn: sqlite3.Connection) -> int | None:
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'oncewire_schema'"
    ).fetchone()
    if not exists:
        return None
    row = conn.execute("SELECT MAX(version) FROM oncewire_schema").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def version_and_tables(conn: sqlite3.Connection) -> tuple[int | None, list[str]]:
    """The schema version, or None and the tables the file holds when it is not a store."""
    names = [
        str(name)
        for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' "
            "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name"
        )
    ]
    if "oncewire_schema" not in names:
        return None, names
    return current_version(conn), []


@contextlib.contextmanager
def _locked(conn: sqlite3.Connection) -> Iterator[None]:
    """A transaction holding SQLite's write lock from its first statement."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _run_script(conn: sqlite3.Connection, script: str) -> None:
    # executescript() would commit first: run statement by statement inside our transaction.
    for statement in split_statements(script):
        conn.execute(statement)


DIALECT = runner.Dialect(
    package=_PACKAGE,
    locked=_locked,
    run_script=_run_script,
    current_version=current_version,
    translate_errors=translate_errors,
    placeholder="?",
    schema_table=SCHEMA_TABLE,
)

# Under the dialect's lock: safe when several processes open the store at once.
migrate = DIALECT.migrate
migrations = DIALECT.migrations
fresh_schema = DIALECT.fresh_schema
