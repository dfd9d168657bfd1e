"""One migration runner for every backend: apply every migration not yet recorded.

A backend keeps its schema as ``schema.sql`` (the whole schema, for a new database) and
numbered files in ``migrations/`` (forward-only). The rule is set-based: an existing database
gets every numbered migration that ``oncewire_schema`` does not record, in order, not only those
above its newest, so a database that took a later number before an earlier one existed (0003,
then 0002 was released) is completed. Several processes may open a new store at once: the
runner re-reads what is applied under the backend's lock and applies it in one transaction.

What differs per backend is a :class:`Dialect`: how to take the lock and run the transaction
(``BEGIN IMMEDIATE`` on SQLite, an advisory lock on PostgreSQL), how to run a script, how to
read the version, and the placeholder of the bookkeeping INSERT.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oncewire.core.errors import SchemaError

__all__ = [
    "Dialect",
    "Migration",
    "check_adoptable",
    "check_current",
    "check_not_newer",
    "migrate",
    "migrations",
]

Migration = tuple[int, str, str]  # (version, file name, SQL)


@dataclass(frozen=True, slots=True)
class Dialect:
    """The backend hooks of :func:`migrate`."""

    package: str  # holds schema.sql and migrations/
    locked: Callable[[Any], AbstractContextManager[None]]  # a transaction under the lock
    run_script: Callable[[Any, str], None]
    current_version: Callable[[Any], int | None]
    translate_errors: Callable[[str], AbstractContextManager[None]]
    placeholder: str  # "?" or "%s"
    schema_table: str  # CREATE TABLE IF NOT EXISTS oncewire_schema (...)

    def migrations(self) -> list[Migration]:
        """(version, name, sql) for every numbered migration file, in order."""
        return migrations(self.package)

    def fresh_schema(self) -> str:
        return fresh_schema(self.package)

    def migrate(self, conn: Any, *, use_fresh_schema: bool = True) -> int:
        """:func:`migrate` with this dialect."""
        return migrate(conn, self, use_fresh_schema=use_fresh_schema)


def migrations(package: str) -> list[Migration]:
    """(version, name, sql) for every numbered migration file of ``package``, in order."""
    folder = _folder(package) / "migrations"
    found = [
        (int(entry.name[:4]), entry.name, entry.read_text(encoding="utf-8"))
        for entry in folder.iterdir()
        if entry.name.endswith(".sql") and entry.name[:4].isdigit()
    ]
    found.sort()
    return found


def fresh_schema(package: str) -> str:
    return (_folder(package) / "schema.sql").read_text(encoding="utf-8")


def _folder(package: str) -> Path:
    """The folder of ``package`` (a dialect's), whose files ship beside its modules."""
    return Path(str(importlib.import_module(package).__file__)).parent


def applied(conn: Any, dialect: Dialect) -> set[int]:
    """The migrations ``oncewire_schema`` records (none when the table does not exist)."""
    if dialect.current_version(conn) is None:
        return set()
    return {int(row[0]) for row in conn.execute("SELECT version FROM oncewire_schema")}


def check_not_newer(version: int | None, latest: int) -> None:
    if version is not None and version > latest:
        raise SchemaError(
            f"the database has schema version {version}; this oncewire knows up to "
            f"{latest}: upgrade oncewire"
        )


def check_current(conn: Any, dialect: Dialect, where: str, version: int) -> None:
    """For a read-only open, which cannot migrate: refuse a schema that is not up to date."""
    available = migrations(dialect.package)
    latest = available[-1][0]
    check_not_newer(version, latest)
    with dialect.translate_errors("reading the schema version"):
        missing = {number for number, _, _ in available} - applied(conn, dialect)
    if version != latest or missing:
        raise SchemaError(
            f"{where} has schema version {version}; this oncewire expects {latest}, and a "
            "read-only open does not migrate: open it once for writing first"
        )


def check_adoptable(where: str, tables: list[str], *, adopt: bool) -> None:
    """Refuse to install oncewire's schema beside ``tables`` unless asked to ``adopt`` them."""
    if tables and not adopt:
        shown = ", ".join(tables[:10]) + (
            f" and {len(tables) - 10} more" if len(tables) > 10 else ""
        )
        raise SchemaError(
            f"{where} holds other tables ({shown}) and no oncewire store: oncewire adds its "
            "tables beside them only when asked (--adopt on the command line, adopt=True in "
            "Python); nothing was changed",
            tables=tables,
        )


def migrate(conn: Any, dialect: Dialect, *, use_fresh_schema: bool = True) -> int:
    """Bring the schema of ``conn`` up to date; return the newest version.

    A new database gets ``schema.sql`` in one go (``use_fresh_schema``) or every numbered file
    in order; both end in the same schema (a test proves it). An up-to-date database is only
    read, without the lock.
    """
    available = migrations(dialect.package)
    latest = available[-1][0]
    numbers = {number for number, _, _ in available}
    with dialect.translate_errors("reading the schema version"):
        if dialect.current_version(conn) == latest and not numbers - applied(conn, dialect):
            return latest  # the common case: no lock needed
    insert = (
        "INSERT INTO oncewire_schema (version, name, applied_at) VALUES "
        f"({dialect.placeholder}, {dialect.placeholder}, {dialect.placeholder})"
    )
    with dialect.translate_errors("migrating the schema"), dialect.locked(conn):
        version = dialect.current_version(conn)  # re-read under the lock
        check_not_newer(version, latest)
        conn.execute(dialect.schema_table)
        now = time.time()
        if not version and use_fresh_schema:
            dialect.run_script(conn, fresh_schema(dialect.package))
            for number, name, _ in available:
                conn.execute(insert, (number, name, now))
            return latest
        done = applied(conn, dialect)
        for number, name, sql in _pending(available, done):
            dialect.run_script(conn, sql)
            conn.execute(insert, (number, name, now))
    return latest


def _pending(available: list[Migration], done: set[int]) -> Iterator[Migration]:
    return (migration for migration in available if migration[0] not in done)
