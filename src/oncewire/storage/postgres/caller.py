"""The caller's own psycopg connection, as oncewire's verbs read it.

``Ledger.accept_in`` and the async caller transaction write through a connection the caller
owns, inside the caller's open transaction: oncewire never commits or rolls it back. The verbs
read rows as tuples whatever ``row_factory`` the caller chose, and an ``AsyncConnection`` is
driven from the verb's thread by awaiting each statement on the connection's own event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from oncewire.storage.postgres.errors import psycopg

__all__ = ["Answered", "AwaitedRows", "TupleRows"]


class TupleRows:
    """The caller's connection as oncewire's verbs read it: rows as tuples, whatever
    ``row_factory`` the caller gave the connection (``dict_row`` is common)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    @property
    def info(self) -> Any:
        return self._conn.info

    def execute(self, sql: Any, params: Any = None) -> Any:
        cursor = self._conn.cursor(row_factory=psycopg.rows.tuple_row)
        return cursor.execute(sql, params)


class Answered:
    """A statement's rows, already read: what a verb reads of a cursor."""

    __slots__ = ("rowcount", "rows")

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self.rows, self.rowcount = rows, rowcount

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return self.rows


class AwaitedRows:
    """The caller's ``psycopg.AsyncConnection`` as oncewire's verbs read it from a thread of
    their own: each statement is awaited on the connection's event loop through ``run`` (which
    blocks the verb's thread until it is answered) and its rows are read there, as tuples."""

    __slots__ = ("_conn", "_run")

    def __init__(self, conn: Any, run: Callable[[Any], Any]) -> None:
        self._conn, self._run = conn, run

    @property
    def info(self) -> Any:
        return self._conn.info

    def execute(self, sql: Any, params: Any = None) -> Answered:
        conn = self._conn

        async def statement() -> Answered:
            cursor = conn.cursor(row_factory=psycopg.rows.tuple_row)
            await cursor.execute(sql, params)
            rows = await cursor.fetchall() if cursor.description is not None else []
            return Answered(rows, cursor.rowcount)

        answered: Answered = self._run(statement())
        return answered
