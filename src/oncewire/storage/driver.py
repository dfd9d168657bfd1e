"""The Driver: what a verb written once needs from a database, and nothing more.

A verb in :mod:`oncewire.storage.verbs` runs named queries (:mod:`oncewire.storage.sql`) through
the store's driver, ``self.db``::

    with self.db.write("renewing leases") as conn:           # one transaction, errors translated
        rows = self.db.all(conn, Q.renew_leases, owner=owner, ...)
    rows = self.db.read(Q.get_effect, key=key)                # outside any transaction

A driver owns the connections (one per thread), the transaction discipline (``BEGIN
IMMEDIATE`` on SQLite, a broken connection forgotten and replaced on PostgreSQL), the
translation of driver errors into :mod:`oncewire.core.errors` and the execution strategy
(``batch``, ``pipeline``, a read ``snapshot``'s isolation, how many rows one ``{values}``
statement carries). The two implementations are
:class:`oncewire.storage.sqlite.driver.SQLiteDriver` and
:class:`oncewire.storage.postgres.driver.PostgresDriver`; what they run statements with is the
same code, :class:`StatementRunner`.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from oncewire.storage.sql import Queries, Query

__all__ = [
    "Driver",
    "Pending",
    "Pipeline",
    "Row",
    "StatementRunner",
    "Transaction",
    "store_transaction",
]

Row = Sequence[Any]


class Transaction(Protocol):
    """An open database transaction shared by the caller and oncewire."""

    def execute(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        """Run the caller's own SQL (in the backend's dialect and placeholder style)."""
        ...


class Pending:
    """The rows of a statement sent through a :class:`Pipeline`: ``rows`` is filled in when the
    pipeline's block has ended (at once where statements do not travel)."""

    __slots__ = ("rows",)

    def __init__(self) -> None:
        self.rows: list[Row] = []

    def one(self) -> Row | None:
        """The first row, or None."""
        return self.rows[0] if self.rows else None


class Pipeline:
    """Statements sent through one pipeline on one connection (see :meth:`Driver.pipeline`).

    ``run`` and ``batch`` send statements whose rows nobody reads (one cursor serves them all);
    ``rows`` sends one whose rows are read into the :class:`Pending` it returns. When ``defer``
    is false (SQLite; a PostgreSQL client without pipeline mode) every statement runs, and is
    read, before the call returns.
    """

    __slots__ = ("_conn", "_defer", "_pending", "_writes")

    def __init__(self, conn: Any, *, defer: bool) -> None:
        self._conn = conn
        self._defer = defer
        self._writes: Any = None
        self._pending: list[tuple[Any, Pending]] = []

    def _cursor(self) -> Any:
        if self._writes is None:
            self._writes = self._conn.cursor()
        return self._writes

    def run(self, q: Query, /, **params: Any) -> None:
        self._cursor().execute(*q.render(params))

    def batch(self, q: Query, rows: Sequence[Mapping[str, Any]]) -> None:
        if rows:
            text, _ = q.render(rows[0])
            self._cursor().executemany(text, [q.render(row)[1] for row in rows])

    def rows(self, q: Query, /, **params: Any) -> Pending:
        pending = Pending()
        cursor = self._conn.cursor()
        cursor.execute(*q.render(params))
        if self._defer:
            self._pending.append((cursor, pending))
        else:
            try:
                pending.rows = list(cursor.fetchall())
            finally:
                cursor.close()
        return pending

    def collect(self) -> None:
        """Read the rows of every deferred statement (once the pipeline has been synced)."""
        for cursor, pending in self._pending:
            pending.rows = list(cursor.fetchall())

    def close(self) -> None:
        for cursor, _ in self._pending:
            cursor.close()
        if self._writes is not None:
            self._writes.close()


class Driver(Protocol):
    """The connection half of a backend; see the module docstring."""

    dialect: str
    queries: Queries
    # Rows one ``{values ...}`` statement carries at most (SQLite binds each value on its own).
    values_chunk: int

    def conn(self) -> Any:
        """This thread's connection (opened on first use, replaced when broken)."""
        ...

    def write(self, what: str) -> AbstractContextManager[Any]:
        """A transaction of its own, yielding its connection: committed on normal exit, rolled
        back on an exception; driver errors become :class:`StorageError` naming ``what``."""
        ...

    def translate_errors(self, what: str) -> AbstractContextManager[None]:
        """Inside the block, a driver error becomes a :class:`StorageError` naming ``what``."""
        ...

    def tx_conn(self, tx: Transaction) -> Any:
        """The connection of the caller's open transaction ``tx`` (refused if it is not open,
        or not one of this store's: a verb ending in ``_in_tx`` never writes outside the
        caller's transaction)."""
        ...

    def read(self, q: Query, /, **params: Any) -> list[Row]:
        """Every row of ``q`` outside a transaction (a dropped idle connection is replaced and
        the read run again; a text that is not UTF-8 is read as undecodable, not an error)."""
        ...

    def run(self, conn: Any, q: Query, /, **params: Any) -> int:
        """Run ``q`` on ``conn``; the number of rows it changed."""
        ...

    def one(self, conn: Any, q: Query, /, **params: Any) -> Row | None:
        """The first row of ``q`` on ``conn``, or None."""
        ...

    def all(self, conn: Any, q: Query, /, **params: Any) -> list[Row]:
        """Every row of ``q`` on ``conn``."""
        ...

    def batch(self, conn: Any, q: Query, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run ``q`` once per parameter set (``executemany``)."""
        ...

    def pipeline(self, conn: Any) -> AbstractContextManager[Pipeline]:
        """The statements sent through the yielded :class:`Pipeline` travel together and are
        answered at the end of the block (PostgreSQL: one round trip); the first error among
        them is the one raised, not the aborts it caused after it. On SQLite, whose statements
        do not travel, each runs when it is sent."""
        ...

    def snapshot(self) -> AbstractContextManager[Any]:
        """Yields this thread's connection, on which every read of the block sees one moment of
        the store: a read-only transaction (deferred ``BEGIN`` on SQLite, ``REPEATABLE READ,
        READ ONLY`` on PostgreSQL) ended with the block, or the transaction already open on it,
        which adds nothing."""
        ...

    def constraint_refusal(
        self, constraint: str, refusal: Callable[[], Exception]
    ) -> AbstractContextManager[None]:
        """Inside the block, the database's refusal naming ``constraint`` (an index or a
        trigger's ``CONSTRAINT``, never recognised by its message) raises ``refusal()`` instead.
        SQLite's errors name no constraint: there the block changes nothing."""
        ...

    def in_transaction(self, conn: Any) -> bool:
        """Whether ``conn`` has a transaction open."""
        ...


def store_transaction(tx: Transaction) -> Transaction:
    """The store's own transaction behind ``tx``. A wrapper that shares one (the Ledger's
    ``with ledger.transaction() as tx``) hands it over as ``tx.store_transaction``, so every
    ``_in_tx`` verb takes either."""
    inner: Transaction | None = getattr(tx, "store_transaction", None)
    return tx if inner is None else inner


class StatementRunner(abc.ABC):
    """How both drivers run a named query on a connection: the part of :class:`Driver` that is
    the same for every DB-API connection. ``read_sql`` (a read outside any transaction, with
    its backend's recovery) is each driver's own."""

    @abc.abstractmethod
    def read_sql(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """Every row of ``sql`` outside a transaction."""

    def read(self, q: Query, /, **params: Any) -> list[Any]:
        return self.read_sql(*q.render(params))

    def run(self, conn: Any, q: Query, /, **params: Any) -> int:
        return int(conn.execute(*q.render(params)).rowcount)

    def one(self, conn: Any, q: Query, /, **params: Any) -> Any:
        return conn.execute(*q.render(params)).fetchone()

    def all(self, conn: Any, q: Query, /, **params: Any) -> list[Any]:
        rows: list[Any] = conn.execute(*q.render(params)).fetchall()  # a list on both drivers
        return rows

    def batch(self, conn: Any, q: Query, rows: Sequence[Mapping[str, Any]]) -> None:
        if not rows:
            return
        text, _ = q.render(rows[0])
        cursor = conn.cursor()
        try:
            cursor.executemany(text, [q.render(row)[1] for row in rows])
        finally:
            cursor.close()

    @contextlib.contextmanager
    def pipeline(self, conn: Any) -> Iterator[Pipeline]:
        statements = Pipeline(conn, defer=False)
        try:
            yield statements
        finally:
            statements.close()
