"""A store's tables read and written around oncewire, on either backend, with the plain driver.

``url`` is what a test hands oncewire: a SQLite file's path, or a PostgreSQL URL (the
``store_url`` fixture gives one of each). SQL is written with ``?`` placeholders and portable
SQL; PostgreSQL's get translated. Every connection is the test's own and autocommits: SQLite's
waits up to ten seconds for a lock (oncewire may be writing), as oncewire's own do.

``rows`` and ``execute`` open a connection for one statement; :class:`Connection` keeps one
open for a test; ``connect`` and ``run`` are for a helper that needs the driver's own connection
(a snapshot of several reads, a lock held while oncewire works).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from oncewire.lab.fixtures import dialect_of, placeholders

__all__ = ["Connection", "connect", "dialect_of", "execute", "integrity_errors", "rows", "run"]

Rows = list[tuple[Any, ...]]


def connect(url: str) -> Any:
    """A new autocommit connection of the test's own: ``sqlite3`` or ``psycopg``."""
    if dialect_of(url) == "postgresql":
        import psycopg

        return psycopg.connect(url, autocommit=True)
    return sqlite3.connect(url, isolation_level=None, timeout=10)


def run(conn: Any, sql: str, params: Sequence[Any] = ()) -> Any:
    """``sql`` (``?`` placeholders) run on ``conn``, a connection from :func:`connect`; its
    cursor. Without parameters PostgreSQL's driver is given none, so a ``%`` is left as is."""
    if isinstance(conn, sqlite3.Connection):
        return conn.execute(sql, tuple(params))
    return conn.execute(placeholders("postgresql", sql).encode(), tuple(params) or None)


def rows(url: str, sql: str, params: Sequence[Any] = ()) -> Rows:
    """Every row ``sql`` returns, as tuples."""
    conn = connect(url)
    try:
        return [tuple(row) for row in run(conn, sql, params).fetchall()]
    finally:
        conn.close()


def execute(url: str, sql: str, params: Sequence[Any] = ()) -> int:
    """Run one statement that returns no rows (committed at once); the rows it changed."""
    conn = connect(url)
    try:
        return int(run(conn, sql, params).rowcount)
    finally:
        conn.close()


def integrity_errors(url: str) -> tuple[type[BaseException], ...]:
    """What the driver raises when the schema refuses a write. On PostgreSQL a boolean column
    also refuses an integer by type, before any constraint is consulted."""
    if dialect_of(url) == "postgresql":
        import psycopg

        return (psycopg.IntegrityError, psycopg.errors.DatatypeMismatch)
    return (sqlite3.IntegrityError,)


class Connection:
    """One connection of the test's own to ``url``, kept open (autocommit), ``?`` placeholders."""

    def __init__(self, url: str) -> None:
        self.integrity_errors = integrity_errors(url)
        self._conn = connect(url)

    def query(self, sql: str, params: Sequence[Any] = ()) -> Rows:
        return [tuple(row) for row in run(self._conn, sql, params).fetchall()]

    def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int(run(self._conn, sql, params).rowcount)

    def close(self) -> None:
        self._conn.close()
