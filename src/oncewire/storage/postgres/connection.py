"""Connections, error translation and migrations for PostgreSQL (psycopg 3)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from oncewire.core.errors import (
    ConfigurationError,
    StatementError,
    StorageError,
    StoreBusy,
    StoreUnreachable,
    StoreUnusable,
)
from oncewire.storage import migrate as runner

__all__ = [
    "connect",
    "connect_timeout_seconds",
    "current_version",
    "migrate",
    "migrations",
    "psycopg",
    "translate_errors",
    "translated",
]

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

DEFAULT_CONNECT_TIMEOUT_SECONDS = 10

_PACKAGE = "oncewire.storage.postgres"
SCHEMA_LOCK = 0x6F6E6365  # advisory lock key held while migrating ("once")


def require_driver() -> Any:
    if psycopg is None:
        raise ConfigurationError(
            "the PostgreSQL backend needs psycopg 3: pip install 'oncewire[postgres]'"
        )
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


@contextmanager
def translate_errors(what: str) -> Iterator[None]:
    if psycopg is None:  # pragma: no cover
        yield
        return
    try:
        yield
    except psycopg.Error as exc:
        raise translated(what, exc) from exc


def connect_timeout_seconds(url: str) -> int:
    """The URL's ``connect_timeout`` when it has one (it wins over our default)."""
    driver = require_driver()
    try:
        value = driver.conninfo.conninfo_to_dict(url).get("connect_timeout")
    except driver.ProgrammingError as exc:
        raise ConfigurationError(f"invalid PostgreSQL URL: {exc}") from exc
    if value is None or str(value).strip() == "":
        return DEFAULT_CONNECT_TIMEOUT_SECONDS
    try:
        return int(str(value))
    except ValueError:
        raise ConfigurationError(
            f"connect_timeout must be a whole number of seconds, not {value!r}"
        ) from None


def connect(url: str, *, timeout_seconds: int | None = None) -> Any:
    driver = require_driver()
    timeout = connect_timeout_seconds(url) if timeout_seconds is None else timeout_seconds
    with translate_errors("connecting to PostgreSQL"):
        return driver.connect(url, autocommit=True, connect_timeout=timeout)


def migrations() -> list[tuple[int, str, str]]:
    """(version, name, sql) for every numbered migration file, in order."""
    return runner.migrations(_PACKAGE)


def fresh_schema() -> str:
    return runner.fresh_schema(_PACKAGE)


def current_version(conn: Any) -> int | None:
    # An MVCC query of the catalog, not to_regclass(): after waiting on the advisory lock, the
    # syscache behind to_regclass() may not yet show a table another process just committed.
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables "
        "WHERE schemaname = current_schema() AND tablename = 'oncewire_schema')"
    ).fetchone()
    if not row[0]:
        return None
    row = conn.execute("SELECT MAX(version) FROM oncewire_schema").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


@contextmanager
def _locked(conn: Any) -> Iterator[None]:
    """A transaction holding the migration advisory lock (concurrent openers take turns)."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        yield


def _run_script(conn: Any, script: str) -> None:
    conn.execute(script)


DIALECT = runner.Dialect(
    package=_PACKAGE,
    locked=_locked,
    run_script=_run_script,
    current_version=current_version,
    translate_errors=translate_errors,
    placeholder="%s",
    schema_table=(
        "CREATE TABLE IF NOT EXISTS oncewire_schema (version INTEGER PRIMARY KEY, "
        "name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
    ),
)


def migrate(conn: Any, *, use_fresh_schema: bool = True) -> int:
    """Bring the schema up to date (:func:`oncewire.storage.migrate.migrate`) under an
    advisory lock (safe with concurrent openers)."""
    return runner.migrate(conn, DIALECT, use_fresh_schema=use_fresh_schema)
