"""A run-ledger database on either backend, read and edited around oncewire.

``RunsDatabase`` is what the run ledger's integration tests hold: the URL a ``Ledger`` opens,
and the plain driver (sqlite3 or psycopg, connected by :mod:`tests.support.tables`) to read the
tables and to edit them as someone with database access would. SQL is written with ``?``
placeholders; PostgreSQL's get translated.
Rows answer both ``row["column"]`` and ``row[0]``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from tests.support import tables

__all__ = ["Row", "RunsDatabase"]


class Row(tuple[Any, ...]):
    """A result row, by position or by column name."""

    names: tuple[str, ...]

    def __new__(cls, names: tuple[str, ...], values: Sequence[Any]) -> Row:
        row = super().__new__(cls, values)
        row.names = names
        return row

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            return tuple.__getitem__(self, self.names.index(key))
        return tuple.__getitem__(self, key)

    def keys(self) -> tuple[str, ...]:
        return self.names


class RunsDatabase:
    def __init__(self, url: str) -> None:
        self.url = url
        self.dialect = tables.dialect_of(url)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        conn = tables.connect(self.url)
        try:
            cursor = tables.run(conn, sql, params)
            names = tuple(d[0] for d in cursor.description)
            return [Row(names, values) for values in cursor.fetchall()]
        finally:
            conn.close()

    def execute(self, *statements: tuple[str, Sequence[Any]]) -> None:
        """Run ``statements`` in one transaction, going around oncewire (triggers kept)."""
        conn = tables.connect(self.url)
        try:
            conn.execute("BEGIN")
            for sql, params in statements:
                tables.run(conn, sql, params)
            conn.execute("COMMIT")
        finally:
            conn.close()

    @property
    def integrity_errors(self) -> tuple[type[BaseException], ...]:
        """What the driver raises when the schema refuses a write."""
        if self.dialect == "sqlite":
            return (sqlite3.IntegrityError,)
        import psycopg

        return (psycopg.IntegrityError,)

    def tamper(self, *statements: tuple[str, Sequence[Any]]) -> None:
        """Edit the history directly, as someone with database access would: the triggers that
        keep events append-only are dropped first."""
        on = " ON oncewire_run_events" if self.dialect == "postgresql" else ""
        drops = [
            (f"DROP TRIGGER IF EXISTS oncewire_run_events_{name}{on}", ())
            for name in ("no_update", "no_delete")
        ]
        self.execute(*drops, *statements)

    def drop_run_references(self) -> None:
        """Let a run row be deleted under its events and projections (PostgreSQL enforces the
        foreign keys that SQLite's plain connections do not)."""
        if self.dialect == "postgresql":
            tables = ("events", "phases", "findings", "actions")
            drop = "ALTER TABLE oncewire_run_{0} DROP CONSTRAINT oncewire_run_{0}_run_id_fkey"
            self.execute(*((drop.format(t), ()) for t in tables))
