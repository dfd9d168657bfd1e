"""The PostgreSQL transaction oncewire shares with its caller, and the ``BEGIN`` it defers.

:class:`PostgresTransaction` is the caller's view of an open transaction, on oncewire's own
connection (the settings oncewire relies on read with each of the caller's statements,
:mod:`~oncewire.storage.postgres.guard`) or on the caller's
(:mod:`~oncewire.storage.postgres.caller`). On oncewire's own connection the ``BEGIN`` waits
for the first statement and travels with it (:class:`FirstStatementBegins`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from oncewire.storage.postgres.errors import psycopg
from oncewire.storage.postgres.guard import SettingsWatch, pipelined, settings_sql
from oncewire.storage.sqlguard import caller_statement, check_statement
from oncewire.storage.transaction import GuardedTransaction

__all__ = [
    "IDLE",
    "INERROR",
    "INTRANS",
    "UNKNOWN",
    "Begun",
    "FirstStatementBegins",
    "PostgresTransaction",
]

IDLE, INTRANS, INERROR, UNKNOWN = 0, 2, 3, 4  # libpq's PQtransactionStatus


class Connections(Protocol):
    """What a deferred ``BEGIN`` asks of the driver when it finds its connection dropped."""

    def forget(self, conn: Any) -> None: ...

    def fresh_conn(self) -> Any: ...


class PostgresTransaction(GuardedTransaction):
    """The caller's view of an open PostgreSQL transaction.

    ``execute`` takes ``:name`` placeholders with a dict (the portable form, translated to
    psycopg's ``%(name)s``), and refuses several statements in one string as well.

    On oncewire's own connection, the settings oncewire relies on are read with each of the
    caller's statements (:mod:`~oncewire.storage.postgres.guard`, kept in ``settings``): once
    one changed, nothing more runs, and the commit is refused.
    """

    __slots__ = ("settings",)

    dialect = "postgresql"

    ended_by_database = (
        "the transaction is no longer open; nothing more was written and nothing will be committed"
    )

    def __init__(self, conn: Any, *, is_open: bool) -> None:
        super().__init__(conn, is_open=is_open)
        self.settings = SettingsWatch()

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        self.check_open()
        check_statement(sql, self.savepoints, "postgresql")
        sql, values = caller_statement(sql, params, "postgresql")
        conn = self.conn
        if not isinstance(conn, FirstStatementBegins):
            return conn.execute(sql, values)  # the caller's own connection: theirs
        return self.settings.run(conn, sql, values)

    def check_open(self) -> None:
        if self.settings.failure is not None:
            raise self.settings.refusal()
        super().check_open()

    def open_on_connection(self) -> bool:
        conn = self.conn
        if isinstance(conn, FirstStatementBegins):
            if not conn.begun:
                return True  # its BEGIN travels with the first statement
            conn = conn.raw
        return bool(conn.info.transaction_status in (INTRANS, INERROR))


class FirstStatementBegins:
    """The connection of a transaction whose ``BEGIN`` has not been sent yet.

    On an autocommit connection, psycopg's ``BEGIN`` is a round trip of its own, answered
    before the first statement may be sent: for a transaction of one statement (an accept),
    three round trips where the statement alone is one. Here the ``BEGIN`` waits for the
    transaction's first statement and the two travel together, in one pipeline with one
    ``Sync`` (one round trip): the statement runs inside the transaction, and its rows, row
    count and error are read before :meth:`execute` returns, as without a pipeline.

    Anything else asked of the connection (a cursor, a pipeline, its status) sends the
    ``BEGIN`` on its own first, as before; so does the driver's ``conn()``
    (:class:`~oncewire.storage.postgres.driver.PostgresDriver`), so that no statement can run
    on this thread's connection outside the transaction while the ``BEGIN`` waits. A block
    that runs no statement sends nothing at all.
    """

    __slots__ = ("block", "driver", "raw")

    def __init__(self, driver: Connections, raw: Any) -> None:
        self.driver, self.raw = driver, raw
        self.block: Any = None  # psycopg's Transaction, once the BEGIN is sent

    @property
    def begun(self) -> bool:
        return self.block is not None

    def begin(self) -> None:
        """Send the ``BEGIN`` now, on its own (nothing else asked for can travel with it)."""
        if self.block is None:
            self._begin_with(None)

    def execute(self, sql: Any, params: Any = None) -> Any:
        if self.block is not None:
            return self.raw.execute(sql, params)
        return self._begin_with(lambda raw: raw.execute(sql, params))

    def watched(self, sql: Any, params: Any, *, baseline: bool) -> tuple[Any, Any, Any]:
        """The caller's statement between two reads of the settings oncewire relies on (the
        first only when ``baseline``), in one round trip: the three cursors, read."""

        def statements(raw: Any) -> tuple[Any, Any, Any]:
            before = raw.execute(settings_sql()) if baseline else None
            cursor = raw.execute(sql, params)
            return cursor, before, raw.execute(settings_sql())

        if self.block is None:
            watched: tuple[Any, Any, Any] = self._begin_with(statements)
            return watched
        if not psycopg.Pipeline.is_supported():
            return statements(self.raw)
        return pipelined(self.raw, statements)

    def _begin_with(self, first: Callable[[Any], Any] | None) -> Any:
        """``BEGIN`` (and ``first(conn)``'s statements, in the same round trip); what ``first``
        returns (its cursors).

        A connection the server dropped while it sat idle is only found out here: nothing
        sent could have committed (the statement ran, if at all, inside a transaction that
        never reached its ``COMMIT``), so a fresh connection takes its place once.
        """
        for retry in (False, True):
            block = psycopg.Transaction(self.raw)
            try:
                if first is None or not psycopg.Pipeline.is_supported():
                    block.__enter__()  # a round trip of its own
                    self.block = block
                    return None if first is None else first(self.raw)

                def begun(raw: Any, block: Any = block) -> Any:
                    block.__enter__()  # queued: sent with the statement
                    self.block = block
                    return first(raw)

                return pipelined(self.raw, begun)  # the Sync read every result into them
            except psycopg.Error as exc:
                if not self.raw.broken or retry:
                    raise  # an entered block is ended (rolled back) with the transaction
                with contextlib.suppress(Exception):
                    block.__exit__(type(exc), exc, None)
                self.block = None
                self.driver.forget(self.raw)
                self.raw = self.driver.fresh_conn()
        raise AssertionError("unreachable")  # pragma: no cover

    def __getattr__(self, name: str) -> Any:
        self.begin()
        return getattr(self.raw, name)


class Begun:
    """Ends a psycopg transaction block that was already entered."""

    __slots__ = ("block",)

    def __init__(self, block: Any) -> None:
        self.block = block

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        return bool(self.block.__exit__(exc_type, exc, tb))
