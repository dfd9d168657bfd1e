"""What PostgreSQL's errors mean: each is translated by its SQLSTATE (never its text).

Serialization failures, deadlocks and lock timeouts become :class:`StoreBusy` (retry); a
connection that failed or a server shutting down :class:`StoreUnreachable` (a commit whose
answer was lost is not known to have failed); no access, no such database, a read-only
server or corrupt data :class:`StoreUnusable`; a statement the server refused
:class:`StatementError`; anything else a :class:`StorageError`. psycopg 3 is imported here,
once, for the backend.
"""

from __future__ import annotations

from typing import Any

from oncewire.core.errors import (
    MissingExtra,
    StatementError,
    StorageError,
    StoreBusy,
    StoreUnreachable,
    StoreUnusable,
)
from oncewire.storage.driver import ErrorTranslation

__all__ = ["psycopg", "require_driver", "translate_errors", "translated"]

psycopg: Any
try:
    import psycopg
except ImportError:  # pragma: no cover - exercised only without the extra installed
    psycopg = None

# SQLSTATE classes and codes (never the message text).
_RETRYABLE = {"40001", "40P01", "55P03"}  # serialization failure, deadlock, lock not available
_CONNECTION_CLASS = "08"  # connection exception
_SHUTDOWN = {"57P01", "57P02", "57P03"}  # admin shutdown / crash shutdown / cannot connect now
# No access, no such database, a read-only server, corrupt data: retrying will not help.
_UNUSABLE_CLASSES = ("28", "3D", "3F")  # authorization, catalog (database), schema name
_UNUSABLE = {"42501", "25006", "XX001", "XX002"}  # privilege, read-only, data/index corrupted
# The statement is wrong: syntax or access rule, data exception, integrity constraint.
_STATEMENT_CLASSES = ("42", "22", "23", "21", "0A")


def require_driver() -> Any:
    if psycopg is None:
        raise MissingExtra("the PostgreSQL backend", "postgres", ["psycopg"])
    return psycopg


def translated(what: str, exc: Exception) -> StorageError:
    """The error-tree exception for a driver error, by SQLSTATE and class (never its text)."""
    state = getattr(exc, "sqlstate", None) or ""
    if state in _RETRYABLE:
        return StoreBusy(f"{what}: {type(exc).__name__} (SQLSTATE {state})")
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if state.startswith(_CONNECTION_CLASS) or state in _SHUTDOWN:
        return StoreUnreachable(f"{what}: the database connection failed: {detail}")
    if state in _UNUSABLE or state.startswith(_UNUSABLE_CLASSES):
        return StoreUnusable(f"{what}: {detail} (SQLSTATE {state})")
    if state.startswith(_STATEMENT_CLASSES):
        return StatementError(f"{what}: the statement was refused: {detail} (SQLSTATE {state})")
    if not state:
        # The driver's own checks (wrong number of parameters, a value it cannot adapt) carry
        # no SQLSTATE, and neither does a connection that failed or broke.
        if isinstance(
            exc, psycopg.ProgrammingError | psycopg.DataError | psycopg.NotSupportedError
        ):
            return StatementError(f"{what}: the statement was refused: {detail}")
        return StoreUnreachable(f"{what}: the database connection failed: {detail}")
    return StorageError(f"{what}: {exc} (SQLSTATE {state})")


def translate_errors(what: str) -> ErrorTranslation:
    return ErrorTranslation(() if psycopg is None else psycopg.Error, translated, what)
