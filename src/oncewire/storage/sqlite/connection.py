"""Connections, pragmas, error translation and migrations for SQLite."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from oncewire.core.errors import (
    SchemaError,
    StatementError,
    StorageError,
    StoreBusy,
    StoreUnusable,
)
from oncewire.storage import migrate as runner

__all__ = [
    "check_version",
    "configure",
    "connect",
    "migrate",
    "migrations",
    "open_connection",
    "path_from_url",
    "translate_errors",
    "translated",
]

_PACKAGE = "oncewire.storage.sqlite"

# Primary result codes (extended codes carry them in the low byte).
_SQLITE_ERROR = 1
_SQLITE_PERM = 3
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_READONLY = 8
_SQLITE_CORRUPT = 11
_SQLITE_CANTOPEN = 14
_SQLITE_CONSTRAINT = 19
_SQLITE_MISMATCH = 20
_SQLITE_AUTH = 23
_SQLITE_RANGE = 25
_SQLITE_NOTADB = 26

# Codes that say the file cannot be used as it is: retrying will not help.
_UNUSABLE = {
    _SQLITE_PERM: "permission denied",
    _SQLITE_READONLY: "the database is read-only (file, directory or mount)",
    _SQLITE_CORRUPT: "the database file is malformed (corrupt)",
    _SQLITE_CANTOPEN: "cannot open the database file",
    _SQLITE_AUTH: "access denied",
    _SQLITE_NOTADB: "the file is not a SQLite database",
}
# Codes that say the statement itself is wrong: a programming error, not an outage.
_STATEMENT = {_SQLITE_ERROR, _SQLITE_CONSTRAINT, _SQLITE_MISMATCH, _SQLITE_RANGE}


def path_from_url(url: str) -> str:
    for prefix in ("sqlite:///", "sqlite://", "sqlite:"):
        if url.startswith(prefix):
            rest = url[len(prefix) :]
            return "/" + rest if prefix == "sqlite:///" and not rest.startswith("/") else rest
    return url


def translated(what: str, exc: sqlite3.Error) -> StorageError:
    """The error-tree exception for a driver error, by SQLite's result code (never its text)."""
    code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return StoreBusy(f"{what}: the database stayed locked by another writer")
    if code in _UNUSABLE:
        return StoreUnusable(f"{what}: {_UNUSABLE[code]}")
    if code in _STATEMENT or isinstance(
        exc, sqlite3.ProgrammingError | sqlite3.InterfaceError | sqlite3.IntegrityError
    ):
        # Wrong placeholders or parameters (the driver's own check has no result code), a
        # syntax error, an unknown table, a constraint.
        return StatementError(f"{what}: the statement was refused: {exc}")
    return StorageError(f"{what}: {exc}")


class translate_errors:
    """Turn driver errors raised inside the block into the error tree, once, at this boundary.

    A class rather than a generator: it wraps every statement on the hot path.
    """

    __slots__ = ("what",)

    def __init__(self, what: str) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, sqlite3.Error):
            raise translated(self.what, exc) from exc


def open_connection(path: str, *, create: bool, busy_timeout_ms: int) -> sqlite3.Connection:
    """A connection that has changed nothing yet: the caller checks the file before
    :func:`configure` switches it to WAL, so a file oncewire refuses is left as it was."""
    if path != ":memory:" and not create and not Path(path).exists():
        raise StoreUnusable(f"no database at {path}")  # a reader never waits for one to appear
    with translate_errors(f"opening {path}"):
        if create or path == ":memory:":
            # check_same_thread=False only so that close() may run on another thread; each
            # connection is used by the one thread that opened it.
            conn = sqlite3.connect(
                path,
                isolation_level=None,
                timeout=busy_timeout_ms / 1000,
                check_same_thread=False,
            )
        else:
            uri = f"file:{Path(path).resolve()}?mode=rw"
            conn = sqlite3.connect(
                uri,
                uri=True,
                isolation_level=None,
                timeout=busy_timeout_ms / 1000,
                check_same_thread=False,
            )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        except BaseException:
            conn.close()
            raise
    return conn


def configure(conn: sqlite3.Connection, path: str, *, synchronous: str) -> None:
    """WAL, the flush level and foreign keys: the settings every oncewire connection runs with."""
    try:
        with translate_errors(f"configuring {path}"):
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if path != ":memory:" and str(mode).lower() != "wal":
                raise StorageError(f"{path}: could not switch the journal to WAL (got {mode})")
            conn.execute(f"PRAGMA synchronous = {synchronous}")
            conn.execute("PRAGMA foreign_keys = ON")
    except BaseException:
        conn.close()
        raise


def connect(
    path: str, *, create: bool, busy_timeout_ms: int, synchronous: str
) -> sqlite3.Connection:
    conn = open_connection(path, create=create, busy_timeout_ms=busy_timeout_ms)
    configure(conn, path, synchronous=synchronous)
    return conn


def check_version(version: int | None, *, create: bool, path: str) -> None:
    """Refuse a file that is not an oncewire store (unless creating one) or is newer than us.

    Runs before :func:`configure`: a refused file keeps its journal mode and its bytes.
    """
    if version is None and not create:
        raise SchemaError(f"{path} is not an oncewire store (no oncewire_schema table)")
    latest = migrations()[-1][0]
    if version is not None and version > latest:
        raise SchemaError(
            f"the database has schema version {version}; this oncewire knows up to "
            f"{latest}: upgrade oncewire"
        )


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) for every numbered migration file, in order."""
    return runner.migrations(_PACKAGE)


def fresh_schema() -> str:
    return runner.fresh_schema(_PACKAGE)


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


SCHEMA_TABLE = """
CREATE TABLE IF NOT EXISTS oncewire_schema (
    version    INTEGER PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at REAL NOT NULL
)"""


def current_version(conn: sqlite3.Connection) -> int | None:
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'oncewire_schema'"
    ).fetchone()
    if not exists:
        return None
    row = conn.execute("SELECT MAX(version) FROM oncewire_schema").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


@contextmanager
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


def migrate(conn: sqlite3.Connection, *, use_fresh_schema: bool = True) -> int:
    """Bring the schema up to date (:func:`oncewire.storage.migrate.migrate`); safe when
    several processes open the file at once."""
    return runner.migrate(conn, DIALECT, use_fresh_schema=use_fresh_schema)
