"""What SQLite's errors mean: each is translated by its result code (never its text).

Busy and locked become :class:`StoreBusy` (retry), a full disk :class:`StoreFull` (nothing of
the write was stored), a file that cannot be used as it is :class:`StoreUnusable`, a statement
the database refused :class:`StatementError`; anything else is a :class:`StorageError`.
"""

from __future__ import annotations

import sqlite3

from oncewire.core.errors import (
    StatementError,
    StorageError,
    StoreBusy,
    StoreFull,
    StoreUnusable,
)
from oncewire.storage.driver import ErrorTranslation

__all__ = ["translate_errors", "translated"]

# Primary result codes (extended codes carry them in the low byte).
_SQLITE_ERROR = 1
_SQLITE_PERM = 3
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_READONLY = 8
_SQLITE_CORRUPT = 11
_SQLITE_FULL = 13
_SQLITE_CANTOPEN = 14
_SQLITE_CONSTRAINT = 19
_SQLITE_MISMATCH = 20
_SQLITE_AUTH = 23
_SQLITE_RANGE = 25
_SQLITE_NOTADB = 26

# Codes that say the file cannot be used as it is: retrying will not help.
# Each with the ``reason`` field its StoreUnusable carries, for a caller that acts on it.
_UNUSABLE = {
    _SQLITE_PERM: ("permission denied", "read_only"),
    _SQLITE_READONLY: ("the database is read-only (file, directory or mount)", "read_only"),
    _SQLITE_CORRUPT: ("the database file is malformed (corrupt)", "corrupt"),
    _SQLITE_CANTOPEN: ("cannot open the database file", "cannot_open"),
    _SQLITE_AUTH: ("access denied", "access_denied"),
    _SQLITE_NOTADB: ("the file is not a SQLite database", "not_a_database"),
}
# Codes that say the statement itself is wrong: a programming error, not an outage.
_STATEMENT = {_SQLITE_ERROR, _SQLITE_CONSTRAINT, _SQLITE_MISMATCH, _SQLITE_RANGE}


def translated(what: str, exc: sqlite3.Error, store: str | None = None) -> StorageError:
    """The error-tree exception for a driver error, by SQLite's result code (never its text).

    ``store`` (the file's path) is named by the errors an operator acts on outside the program:
    a full disk is one (free space, or move the file), and the message says so.
    """
    code = (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF
    if code in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return StoreBusy(f"{what}: the database stayed locked by another writer")
    if code == _SQLITE_FULL:
        # SQLite undid the statement (and, on a full disk, may have rolled the whole
        # transaction back): nothing of this write is in the file.
        return StoreFull(
            f"{what}: disk full: SQLite cannot grow {store or 'the database'} (SQLITE_FULL); "
            "nothing of this write was stored"
        )
    if code in _UNUSABLE:
        text, reason = _UNUSABLE[code]
        return StoreUnusable(f"{what}: {text}", reason=reason)
    if code in _STATEMENT or isinstance(
        exc, sqlite3.ProgrammingError | sqlite3.InterfaceError | sqlite3.IntegrityError
    ):
        # Wrong placeholders or parameters (the driver's own check has no result code), a
        # syntax error, an unknown table, a constraint.
        return StatementError(f"{what}: the statement was refused: {exc}")
    return StorageError(f"{what}: {exc}")


def translate_errors(what: str) -> ErrorTranslation:
    return ErrorTranslation(sqlite3.Error, translated, what)
