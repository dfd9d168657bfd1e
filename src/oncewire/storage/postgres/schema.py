"""The PostgreSQL schema: its version table, the packaged migrations and how they run.

Migrations run in one transaction holding an advisory lock (:data:`SCHEMA_LOCK`), so several
processes opening one database at once take turns, through the shared runner
(:mod:`oncewire.storage.migrate`). :func:`fresh_schema` is the schema a new store gets, which
the inspection (:mod:`~oncewire.storage.postgres.inspect`) compares a store with.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from oncewire.storage import migrate as runner
from oncewire.storage.postgres.errors import translate_errors

__all__ = ["DIALECT", "SCHEMA_LOCK", "current_version", "fresh_schema", "migrate", "migrations"]

_PACKAGE = "oncewire.storage.postgres"
SCHEMA_LOCK = 0x6F6E6365  # advisory lock key held while migrating ("once")


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

# Under the dialect's lock: safe when several processes open the store at once.
migrate = DIALECT.migrate
migrations = DIALECT.migrations
fresh_schema = DIALECT.fresh_schema
