"""Connections, error translation and migrations for PostgreSQL (psycopg 3)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any

from oncewire.core.errors import (
    ConfigurationError,
    SchemaError,
    StatementError,
    StorageError,
    StoreBusy,
    StoreUnreachable,
    StoreUnusable,
)

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
    folder = resources.files("oncewire.storage.postgres") / "migrations"
    found = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql") and entry.name[:4].isdigit():
            found.append((int(entry.name[:4]), entry.name, entry.read_text(encoding="utf-8")))
    found.sort()
    return found


def fresh_schema() -> str:
    return (resources.files("oncewire.storage.postgres") / "schema.sql").read_text(encoding="utf-8")


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


def _applied(conn: Any) -> set[int]:
    if current_version(conn) is None:
        return set()
    return {int(row[0]) for row in conn.execute("SELECT version FROM oncewire_schema")}


def _missing(conn: Any, available: list[tuple[int, str, str]]) -> bool:
    return bool({number for number, _, _ in available} - _applied(conn))


def migrate(conn: Any, *, use_fresh_schema: bool = True) -> int:
    """Bring the schema up to date under an advisory lock (safe with concurrent openers)."""
    available = migrations()
    latest = available[-1][0]
    with translate_errors("reading the schema version"):
        if current_version(conn) == latest and not _missing(conn, available):
            return latest
    with translate_errors("migrating the schema"), conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
        version = current_version(conn)
        if version is not None and version > latest:
            raise SchemaError(
                f"the database has schema version {version}; this oncewire knows up to "
                f"{latest}: upgrade oncewire"
            )
        conn.execute(
            "CREATE TABLE IF NOT EXISTS oncewire_schema (version INTEGER PRIMARY KEY, "
            "name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
        )
        now = time.time()
        if not version:
            if use_fresh_schema:
                conn.execute(fresh_schema())
                for number, name, _ in available:
                    conn.execute(
                        "INSERT INTO oncewire_schema (version, name, applied_at) "
                        "VALUES (%s, %s, %s)",
                        (number, name, now),
                    )
                return latest
            version = 0
        # Every migration not yet recorded, not only those above the newest: a database that
        # took a later number before an earlier one existed (0003 before 0002) still gets it.
        applied = _applied(conn)
        for number, name, sql in available:
            if number in applied:
                continue
            conn.execute(sql)
            conn.execute(
                "INSERT INTO oncewire_schema (version, name, applied_at) VALUES (%s, %s, %s)",
                (number, name, now),
            )
    return latest
